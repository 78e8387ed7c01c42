"""The GPU engine path: static (preallocated) KV caches written through device-side indices, graphed.

`forward` (the target's forward on a static cache), `draft` (drafters' forwards on static caches, one
CUDA graph per shape).
"""
