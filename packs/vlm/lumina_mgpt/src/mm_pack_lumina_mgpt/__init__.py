"""mmcore pack for Lumina-mGPT (Chameleon architecture)."""
