"""What every media decoder raises: a file that cannot be used, named, for the bad-sample policy."""


class MediaError(Exception):
    """A media file that cannot be used (unreadable, truncated, too short, too long)."""
