"""draftsmith.kernels: Triton kernels, each next to a pure-torch `*_ref` oracle of the same signature.

Empty until the GPU kernels issue lands; the runtime uses its pure-torch paths meanwhile.
"""
