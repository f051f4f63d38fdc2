"""I/O out of the pipeline: Prometheus collector, OTel span emitter, HTTP API and page, journal."""
