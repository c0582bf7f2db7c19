"""A stand-in for torch in tests/python/test_package.py: records the calls cachalot.torch.install() makes."""
__version__ = "2.11.0+stand-in"  # a supported torch: cachalot.torch refuses one older than 2.0
calls = []


class _Memory:
    class CUDAPluggableAllocator:
        def __init__(self, path, malloc_name, free_name):
            calls.append(("CUDAPluggableAllocator", path, malloc_name, free_name))

    @staticmethod
    def change_current_allocator(alloc):
        calls.append(("change_current_allocator", alloc))


class cuda:  # noqa: N801 (torch's module name)
    memory = _Memory

    @staticmethod
    def current_device():
        return 0


def device(d):
    raise NotImplementedError("stand-in")
