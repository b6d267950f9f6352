"""mmcore pack for InternVL 3 / 3.5 in the transformers format."""
