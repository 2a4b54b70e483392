// Run a layer norm whose PTX was written by `normc ptx`, from plain C++ with the CUDA driver API.
//
//   normc ptx "t d : norm over d ; scale d ; shift d" --shape 4096,1024 --dtype float32 --stats -o ln.ptx
//   ./normc_ptx_run ln.ptx 4096 1024
//
// The file holds one PTX module per kernel, each after a header line
//   // normc kernel i/n: entry=E, grid=G, block=B, shared=S bytes, workspace=W floats, cluster=C
// Every kernel takes seven pointers: x, out, scale, shift, mean, rstd, workspace (null where unused); the
// launch is 1-D (grid G CTAs, block B) with static shared memory only, and the kernels run in file order on
// one stream, sharing a float32 workspace of W elements. C > 1: launch with thread-block clusters of C CTAs
// along x (cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; above 8, allow non-portable sizes). The shape and layout are baked into the PTX: run
// it on exactly the shape (and a row-major float32 x) it was generated for.
#include <cuda.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#define CHECK(call)                                                                  \
  do {                                                                               \
    CUresult r_ = (call);                                                            \
    if (r_ != CUDA_SUCCESS) {                                                        \
      const char* msg = nullptr;                                                     \
      cuGetErrorString(r_, &msg);                                                    \
      std::fprintf(stderr, "%s failed: %s\n", #call, msg ? msg : "unknown error");  \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

struct Kernel {
  std::string entry, ptx;
  unsigned grid = 0, block = 0, cluster = 1;
  size_t workspace = 0;
};

static std::vector<Kernel> read_modules(const char* path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path);
    std::exit(2);
  }
  std::regex head(R"(^// normc kernel \d+/\d+: entry=(\S+), grid=(\d+), block=(\d+), shared=\d+ bytes, workspace=(\d+) floats(?:, cluster=(\d+))?)");
  std::vector<Kernel> ks;
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, head)) {
      Kernel k;
      k.entry = m[1];
      k.grid = std::stoul(m[2]);
      k.block = std::stoul(m[3]);
      k.workspace = std::stoull(m[4]);
      k.cluster = m[5].matched ? std::stoul(m[5]) : 1;
      ks.push_back(k);
    } else if (!ks.empty()) {
      ks.back().ptx += line + "\n";
    }
  }
  if (ks.empty()) {
    std::fprintf(stderr, "%s has no '// normc kernel' header: write it with `normc ptx ... -o FILE`\n", path);
    std::exit(2);
  }
  return ks;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s FILE.ptx T D   (the shape given to normc ptx)\n", argv[0]);
    return 2;
  }
  const size_t T = std::stoull(argv[2]), D = std::stoull(argv[3]), n = T * D;
  std::vector<Kernel> ks = read_modules(argv[1]);

  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));

  std::vector<CUmodule> mods(ks.size());
  std::vector<CUfunction> fns(ks.size());
  for (size_t i = 0; i < ks.size(); ++i) {
    CHECK(cuModuleLoadData(&mods[i], ks[i].ptx.c_str()));  // the driver JIT-compiles the PTX for this GPU
    CHECK(cuModuleGetFunction(&fns[i], mods[i], ks[i].entry.c_str()));
  }

  std::mt19937 rng(0);
  std::normal_distribution<float> normal(0.5f, 2.0f);
  std::vector<float> x(n), w(D), b(D), y(n), mean(T), rstd(T);
  for (auto& v : x) v = normal(rng);
  for (size_t j = 0; j < D; ++j) {
    w[j] = 1.0f + 0.001f * j;
    b[j] = 0.25f;
  }

  CUdeviceptr dx, dy, dw, db, dm, dr, dws = 0;
  CHECK(cuMemAlloc(&dx, n * 4));
  CHECK(cuMemAlloc(&dy, n * 4));
  CHECK(cuMemAlloc(&dw, D * 4));
  CHECK(cuMemAlloc(&db, D * 4));
  CHECK(cuMemAlloc(&dm, T * 4));
  CHECK(cuMemAlloc(&dr, T * 4));
  if (ks[0].workspace) CHECK(cuMemAlloc(&dws, ks[0].workspace * 4));
  CHECK(cuMemcpyHtoD(dx, x.data(), n * 4));
  CHECK(cuMemcpyHtoD(dw, w.data(), D * 4));
  CHECK(cuMemcpyHtoD(db, b.data(), D * 4));

  void* params[7] = {&dx, &dy, &dw, &db, &dm, &dr, &dws};
  for (size_t i = 0; i < ks.size(); ++i) {
    if (ks[i].cluster <= 1) {
      CHECK(cuLaunchKernel(fns[i], ks[i].grid, 1, 1, ks[i].block, 1, 1, 0, nullptr, params, nullptr));
      continue;
    }
    if (ks[i].cluster > 8)
      CHECK(cuFuncSetAttribute(fns[i], CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = ks[i].cluster;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg{};
    cfg.gridDimX = ks[i].grid;  // in CTAs: a multiple of the cluster size
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = ks[i].block;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CHECK(cuLaunchKernelEx(&cfg, fns[i], params, nullptr));
  }
  CHECK(cuCtxSynchronize());
  CHECK(cuMemcpyDtoH(y.data(), dy, n * 4));
  CHECK(cuMemcpyDtoH(mean.data(), dm, T * 4));

  double max_err = 0, max_ref = 0, max_mean_err = 0;
  for (size_t t = 0; t < T; ++t) {
    double s = 0, q = 0;
    for (size_t j = 0; j < D; ++j) s += x[t * D + j];
    const double mu = s / D;
    for (size_t j = 0; j < D; ++j) q += (x[t * D + j] - mu) * (x[t * D + j] - mu);
    const double r = 1.0 / std::sqrt(q / D + 1e-5);
    for (size_t j = 0; j < D; ++j) {
      const double ref = (x[t * D + j] - mu) * r * w[j] + b[j];
      max_err = std::fmax(max_err, std::fabs(ref - y[t * D + j]));
      max_ref = std::fmax(max_ref, std::fabs(ref));
    }
    max_mean_err = std::fmax(max_mean_err, std::fabs(mu - mean[t]));
  }
  std::printf("%zu kernel(s) loaded from %s; x: %zu x %zu float32\n", ks.size(), argv[1], T, D);
  std::printf("max|y - ref| / max|ref| = %.2e, max|mean - ref| = %.2e (float64 reference on the host)\n",
              max_err / max_ref, max_mean_err);
  for (auto m : mods) cuModuleUnload(m);
  cuMemFree(dx); cuMemFree(dy); cuMemFree(dw); cuMemFree(db); cuMemFree(dm); cuMemFree(dr);
  if (dws) cuMemFree(dws);
  cuDevicePrimaryCtxRelease(dev);
  return max_err / max_ref < 1e-5 ? 0 : 1;
}
