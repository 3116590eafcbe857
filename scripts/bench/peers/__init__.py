"""The peers `make bench` runs the pipeline against, one module per family (see bench/__init__)."""
