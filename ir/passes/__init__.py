"""Graph-to-graph passes; `pipeline.PIPELINE` lists them in the order they run."""
