"""Numbers every implementation shares, defined once (no numba here: importing
this must stay cheap)."""
import math

# GELU, tanh form: 0.5 u (1 + tanh(GELU_K (u + GELU_A u^3)))
GELU_K = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715
