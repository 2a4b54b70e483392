"""The driver launch path (normc.runtime.gpu.Loaded) without a GPU: the cuda.bindings driver calls are faked,
and the tests read back what a launch hands the driver (the kernel arguments through the parameter buffer, the
grid, block, stream and launch attributes). Real launches are covered by the GPU tests."""

import ctypes
import threading

import pytest
from cuda.bindings import driver

import normc
from normc.runtime import gpu

OK = driver.CUresult.CUDA_SUCCESS
A = driver.CUlaunchAttributeID


class FakeDriver:
    """Records the library loads and launches normc asks for; ``fail`` names calls that return an error."""

    def __init__(self, monkeypatch, fail=(), per_sm=2, sms=132):
        self.images, self.launches, self.fail = [], [], set(fail)
        self.per_sm, self.sms = per_sm, sms
        self.unloaded = []
        for name in ("cuLibraryLoadData", "cuLibraryGetKernel", "cuLibraryUnload", "cuLaunchKernel",
                     "cuLaunchKernelEx", "cuKernelSetAttribute", "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                     "cuCtxGetDevice", "cuDeviceGetAttribute"):
            monkeypatch.setattr(gpu._cu, name, getattr(self, name))

    def _err(self, what):
        return driver.CUresult.CUDA_ERROR_INVALID_IMAGE if what in self.fail else OK

    def cuLibraryLoadData(self, image, jit_options, jit_values, n_jit, lib_options, lib_values, n_lib):
        assert (jit_options, jit_values, n_jit, lib_options, lib_values, n_lib) == ([], [], 0, [], [], 0)
        kind = "ptx" if image.endswith(b"\0") else "cubin"
        self.images.append(image)
        return (self._err(kind), f"library:{kind}")

    def cuLibraryGetKernel(self, library, name):
        return (OK, (library, name))

    def cuLibraryUnload(self, library):
        self.unloaded.append(library)
        return (OK,)

    def cuKernelSetAttribute(self, attribute, value, kernel, dev):
        self.non_portable = (attribute, value, kernel, dev)
        return (self._err("non-portable"),)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function, block, smem):
        return (OK, self.per_sm)

    def cuCtxGetDevice(self):
        return (OK, 0)

    def cuDeviceGetAttribute(self, attribute, dev):
        return (OK, self.sms)

    @staticmethod
    def _args(params, n):
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        return tuple(ctypes.c_uint64.from_address(slots[i]).value for i in range(n))

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.launches.append({"f": f, "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem,
                              "stream": int(stream), "args": self._args(params, self.nargs), "ex": None})
        return (self._err("launch"),)

    def cuLaunchKernelEx(self, cfg, f, params, extra):
        attrs = {a.id: a.value for a in cfg.attrs[:cfg.numAttrs]}
        ex = {}
        if A.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION in attrs:
            c = attrs[A.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION].clusterDim
            ex["cluster"] = (c.x, c.y, c.z)
        if A.CU_LAUNCH_ATTRIBUTE_COOPERATIVE in attrs:
            ex["cooperative"] = attrs[A.CU_LAUNCH_ATTRIBUTE_COOPERATIVE].cooperative
        if A.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION in attrs:
            ex["pdl"] = attrs[A.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]\
                .programmaticStreamSerializationAllowed
        self.launches.append({"f": f, "grid": (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
                              "block": (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ), "smem": cfg.sharedMemBytes,
                              "stream": int(cfg.hStream), "args": self._args(params, self.nargs), "ex": ex})
        return (self._err("launch"),)


def test_plain_launch_passes_the_arguments_through_the_parameter_buffer(monkeypatch):
    fake = FakeDriver(monkeypatch)
    k = gpu.Loaded("ptx text", b"cubin bytes", "normc_kernel", 528, 256)
    assert fake.images == [b"cubin bytes"] and k.function == ("library:cubin", b"normc_kernel")
    fake.nargs = 7
    args = (0x7F0000001000, 0x7F0000002000, 0, 0x7F0000003000, 0, 0, 2**64 - 1)
    k.launcher(0, *args)
    k.launcher(0xABC, *range(1, 8))  # the next launch overwrites the buffer
    assert fake.launches[0] == {"f": k.function, "grid": (528, 1, 1), "block": (256, 1, 1), "smem": 0,
                                "stream": 0, "args": args, "ex": None}
    assert fake.launches[1]["args"] == tuple(range(1, 8)) and fake.launches[1]["stream"] == 0xABC
    fake.nargs = 9  # the backward kernels take nine
    k.launcher(5, *range(10, 19))
    assert fake.launches[2]["args"] == tuple(range(10, 19))


@pytest.mark.parametrize("cluster,coop,pdl,want_grid,want_ex", [
    (4, False, False, 512, {"cluster": (4, 1, 1)}),
    (16, False, True, 512, {"cluster": (16, 1, 1)}),  # clustered: launched without PDL, as before
    (1, True, False, 264, {"cooperative": 1}),  # capped at 2 CTAs per SM x 132 SMs
    (1, False, True, 512, {"pdl": 1}),
])
def test_extended_launches_carry_their_attributes(cluster, coop, pdl, want_grid, want_ex, monkeypatch):
    fake = FakeDriver(monkeypatch)
    k = gpu.Loaded("ptx", b"cubin", "e", 512, 128, cluster, coop, pdl)
    fake.nargs = 7
    for stream in (0, 77, 0):
        k.launcher(stream, *range(7))
    assert [L["stream"] for L in fake.launches] == [0, 77, 0]
    for L in fake.launches:
        assert L["grid"] == (want_grid, 1, 1) and L["block"] == (128, 1, 1) and L["ex"] == want_ex
        assert L["args"] == tuple(range(7))
    assert k.grid == want_grid


def test_pdl_can_be_switched_off(monkeypatch):
    fake = FakeDriver(monkeypatch)
    monkeypatch.setattr(gpu, "PDL", False)
    k = gpu.Loaded("ptx", b"cubin", "e", 64, 128, 1, False, True)
    fake.nargs = 7
    k.launcher(0, *range(7))
    assert fake.launches[0]["ex"] is None


def test_cooperative_kernel_that_fits_no_sm_is_an_error(monkeypatch):
    FakeDriver(monkeypatch, per_sm=0)
    with pytest.raises(normc.CompileError, match="no CTA of 1024 threads fits an SM"):
        gpu.Loaded("ptx", b"cubin", "e", 64, 1024, 1, True)


def test_refused_non_portable_cluster_reads_as_not_fitting(monkeypatch):
    fake = FakeDriver(monkeypatch, fail={"non-portable"})
    k = gpu.Loaded("ptx", b"cubin", "e", 64, 128, 16)
    assert fake.non_portable == (driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1,
                                 k.function, 0)
    assert k.clusters_fit() is False
    assert gpu.Loaded("ptx", b"cubin", "e", 64, 128, 8).cluster_allowed  # 8: portable, nothing asked


def test_falls_back_to_the_ptx_and_then_says_why_nothing_loads(monkeypatch):
    fake = FakeDriver(monkeypatch, fail={"cubin"})
    k = gpu.Loaded("the ptx", b"cubin", "e", 1, 32)
    assert fake.images == [b"cubin", b"the ptx\0"] and k.function[0] == "library:ptx"
    FakeDriver(monkeypatch, fail={"cubin", "ptx"})
    with pytest.raises(normc.CompileError, match=r"cubin: CUDA_ERROR_INVALID_IMAGE; PTX JIT: CUDA_ERROR_INVALID_IMAGE"):
        gpu.Loaded("the ptx", b"cubin", "e", 1, 32)
    fake = FakeDriver(monkeypatch)
    gpu.Loaded("the ptx", None, "e", 1, 32)  # no cubin (nvJitLink could not link): the driver JITs the PTX
    assert fake.images == [b"the ptx\0"]


def test_refused_launch_raises_naming_the_kernel(monkeypatch):
    fake = FakeDriver(monkeypatch, fail={"launch"})
    fake.nargs = 7
    k = gpu.Loaded("ptx", b"cubin", "normc_inner", 1, 32)
    with pytest.raises(RuntimeError, match="launching normc_inner failed: CUDA_ERROR_INVALID_IMAGE"):
        k.launcher(0, *range(7))


def test_concurrent_launches_of_one_kernel_keep_their_own_arguments(monkeypatch):
    """The parameter buffer is shared by the kernel's launches: each launch fills it and hands it to the driver
    under a lock, so threads launching at once never see each other's arguments."""
    fake = FakeDriver(monkeypatch)
    fake.nargs = 7
    k = gpu.Loaded("ptx", b"cubin", "e", 1, 32)
    real = fake.cuLaunchKernel

    def slow_launch(*a):
        import time

        time.sleep(0)  # yield the GIL between reading the buffer and returning
        return real(*a)

    monkeypatch.setattr(gpu._cu, "cuLaunchKernel", slow_launch)

    def work(t):
        for i in range(200):
            k.launcher(t, *([t * 1000 + i] * 7))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake.launches) == 800
    for L in fake.launches:
        assert len(set(L["args"])) == 1 and L["args"][0] // 1000 == L["stream"]


def test_a_collected_kernel_unloads_its_library(monkeypatch):
    """Each Loaded owns its library (cuLibraryLoadData): dropping it (a Compiled object going away, or a plan
    load_fitting_clusters rejected) unloads the library instead of keeping it for the life of the process."""
    import gc

    fake = FakeDriver(monkeypatch)
    k = gpu.Loaded("ptx", b"cubin", "e", 1, 32)
    assert fake.unloaded == []
    del k
    gc.collect()
    assert fake.unloaded == ["library:cubin"]
