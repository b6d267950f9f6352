"""Accelerator plugins: one module per device kind, each its own entry point."""
