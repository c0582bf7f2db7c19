"""A stand-in for a torch older than cachalot.torch supports (1.13.1, Debian 12's python3-torch): it has
torch.cuda but no torch.cuda.memory.CUDAPluggableAllocator, which PyTorch first released in 2.0."""
__version__ = "1.13.1"


class cuda:  # noqa: N801 (torch's module name)
    class memory:  # noqa: N801
        pass
