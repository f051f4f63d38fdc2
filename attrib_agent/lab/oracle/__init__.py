"""A differential oracle for the scheduler re-simulation: vLLM's own v1 `Scheduler` and `KVCacheManager`,
driven standalone on CPU with fake model outputs, fed the same request streams as
`attribution.scheduler_sim` and compared step by step. Lab only: the agent never imports vLLM.
"""
