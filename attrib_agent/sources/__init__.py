"""Sources: the I/O that reads vLLM and the GPU (poll, tail, receive), each beside a pure parser.

Every source emits the frozen events of `attrib_agent.events` and keeps a `SourceHealth`.
"""
