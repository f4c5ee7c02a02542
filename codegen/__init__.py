"""Code generation: the sharded module (DTensor, pipelining) that runs a plan."""
