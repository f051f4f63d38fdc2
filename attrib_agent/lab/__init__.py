"""The lab: a real vLLM on CPU, a load client, a raw-signal recorder and counterfactual truth."""
