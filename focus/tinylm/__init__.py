"""The embedded tiny model: weights, invariant serving numerics, engine and HTTP server."""
