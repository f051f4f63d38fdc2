"""attrib-agent: who slowed request X on a shared vLLM server, by how much, and through which resource."""

__version__ = "0.1.0"
