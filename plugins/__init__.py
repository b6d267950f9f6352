"""Built-in infrastructure plugins of mmcore, registered through the ``mmcore.plugins`` entry points."""
