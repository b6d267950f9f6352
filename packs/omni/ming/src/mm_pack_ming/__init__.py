"""mmcore pack for Ming-Lite-Omni (the understanding side)."""
