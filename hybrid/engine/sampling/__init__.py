"""From a step's logits to each request's next token: sampling settings, the sampler, grammar
masks for structured output, stop strings."""
