"""Silent shape bugs: models that run and compute the wrong thing, each with a correct twin."""
