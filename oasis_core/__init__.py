"""OasisKV shared policy core: specs, geometry, lookahead scoring, capped eviction, mapping, RPF, traces.

Imports numpy only; never torch, simpy or triton at import time.
"""
