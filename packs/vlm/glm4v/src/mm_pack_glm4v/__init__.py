"""mmcore pack for GLM-4.1V on the transformers model class."""
