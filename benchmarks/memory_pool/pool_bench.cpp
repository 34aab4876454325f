// ferrio's pool vs RMM's pool_memory_resource vs cudaMallocAsync, driven by the same C++ loops.
//
// ferrio's pool is reached through its C ABI (crates/ferrio/examples/pool_capi.rs, built as
// libpool_capi.so); RMM through its headers and librmm.so from the librmm-cu13 wheel; the
// driver's pool through cudaMallocAsync/cudaFreeAsync. Built on a machine without a GPU by
// benchmarks/memory_pool/build_gpu.sh (g++ and the CUDA headers of the nvidia-* wheels, no
// nvcc: the spin kernel is PTX loaded with cuModuleLoadData), run by run_gpu.sh.
//
// Two scenarios:
//   contention  T threads x S streams (thread t on stream t % S), each thread keeping 16 live
//               blocks of 256 B..256 KiB and replacing one per step: allocate/free pairs per
//               second, host side only (no kernels).
//   kernels     the rapidsai/rmm#1887 scenario: N streams, one host thread each, K times
//               { p = allocate(1 MiB, s); spin kernel on s writing p; free(p, s) }; wall time
//               until every stream is done, against K x spin (perfect overlap), and the host
//               time spent inside allocate and free. "none" launches the same kernels on
//               preallocated buffers (the overlap the GPU gives without any allocator).
//               Three starting states: "warm" (pools made with 256 MiB, then one untimed
//               round on the same allocator), "fresh" (pools made with 256 MiB, no round
//               first: every stream's first allocation meets an empty free list, the
//               rmm#1887 "not pre-warmed" case; RMM's pool always starts with an initial size)
//               and "empty" (pools made with no memory: the first allocations grow them from
//               the driver; cudaMallocAsync: its pool trimmed to 0 first).
//
// Prints a table and, with --json PATH, one JSON object per measurement.

#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>

#include <cuda.h>
#include <cuda/stream_ref>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern "C" {
struct FerrioPool;
struct FerrioStream;
FerrioPool* ferrio_pool_create(int device, size_t initial_bytes, size_t grow_bytes);
void ferrio_pool_destroy(FerrioPool* pool);
FerrioStream* ferrio_stream_register(const FerrioPool* pool, void* stream);
void ferrio_stream_unregister(const FerrioPool* pool, FerrioStream* handle);
void* ferrio_allocate(const FerrioPool* pool, size_t bytes, const FerrioStream* handle);
int ferrio_deallocate(const FerrioPool* pool, void* ptr, size_t bytes, const FerrioStream* handle);
}

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what)
{
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + ": " +
                             cudaGetErrorString(e));
  }
}

[[noreturn]] void die(const std::string& msg)
{
  std::fprintf(stderr, "pool_bench: %s\n", msg.c_str());
  std::exit(1);
}

constexpr size_t kInitialBytes = 256u << 20;  // what the warm pools start with
size_t grow_bytes = 32u << 20;  // ferrio's growth step (its default; --grow-mib)
constexpr int kLive            = 16;
constexpr size_t kSizes[]      = {256, 512, 1u << 10, 4u << 10, 8u << 10, 16u << 10, 64u << 10, 256u << 10};

// ---- allocators ---------------------------------------------------------------------------

// One allocator over a fixed set of streams; alloc/free name a stream by index.
struct Allocator {
  virtual ~Allocator()                                   = default;
  virtual const char* name() const                       = 0;
  virtual void bind(const std::vector<cudaStream_t>& ss) = 0;
  virtual void unbind()                                  = 0;
  virtual void* alloc(size_t bytes, int s)               = 0;
  virtual void free(void* p, size_t bytes, int s)        = 0;
};

struct FerrioAlloc final : Allocator {
  FerrioPool* pool;
  std::vector<FerrioStream*> handles;
  explicit FerrioAlloc(size_t initial)
    : pool(ferrio_pool_create(0, initial, grow_bytes))
  {
    if (pool == nullptr) { die("ferrio_pool_create failed"); }
  }
  ~FerrioAlloc() override
  {
    unbind();
    ferrio_pool_destroy(pool);
  }
  const char* name() const override { return "ferrio"; }
  void bind(const std::vector<cudaStream_t>& ss) override
  {
    unbind();
    for (auto s : ss) {
      handles.push_back(ferrio_stream_register(pool, s));
    }
  }
  void unbind() override
  {
    for (auto h : handles) {
      ferrio_stream_unregister(pool, h);
    }
    handles.clear();
  }
  void* alloc(size_t bytes, int s) override
  {
    void* p = ferrio_allocate(pool, bytes, handles[s]);
    if (p == nullptr) { die("ferrio_allocate failed"); }
    return p;
  }
  void free(void* p, size_t bytes, int s) override
  {
    if (ferrio_deallocate(pool, p, bytes, handles[s]) != 0) { die("ferrio_deallocate failed"); }
  }
};

struct RmmAlloc final : Allocator {
  rmm::mr::cuda_memory_resource upstream;
  rmm::mr::pool_memory_resource pool;
  std::vector<cudaStream_t> streams;
  explicit RmmAlloc(size_t initial) : pool(upstream, initial) {}
  const char* name() const override { return "rmm-pool"; }
  void bind(const std::vector<cudaStream_t>& ss) override { streams = ss; }
  void unbind() override { streams.clear(); }
  void* alloc(size_t bytes, int s) override
  {
    return pool.allocate(cuda::stream_ref{streams[s]}, bytes, 256);
  }
  void free(void* p, size_t bytes, int s) override
  {
    pool.deallocate(cuda::stream_ref{streams[s]}, p, bytes, 256);
  }
};

struct AsyncAlloc final : Allocator {
  std::vector<cudaStream_t> streams;
  explicit AsyncAlloc(bool reserve)
  {
    cudaMemPool_t mp;
    check(cudaDeviceGetDefaultMemPool(&mp, 0), "cudaDeviceGetDefaultMemPool");
    uint64_t threshold = UINT64_MAX;  // keep freed memory across synchronizations, as RMM does
    check(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &threshold),
          "cudaMemPoolSetAttribute");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaMemPoolTrimTo(mp, 0), "cudaMemPoolTrimTo");
    if (reserve) {
      void* p;
      check(cudaMallocAsync(&p, kInitialBytes, nullptr), "cudaMallocAsync");
      check(cudaFreeAsync(p, nullptr), "cudaFreeAsync");
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
  }
  const char* name() const override { return "cuMemAllocAsync"; }
  void bind(const std::vector<cudaStream_t>& ss) override { streams = ss; }
  void unbind() override { streams.clear(); }
  void* alloc(size_t bytes, int s) override
  {
    void* p;
    check(cudaMallocAsync(&p, bytes, streams[s]), "cudaMallocAsync");
    return p;
  }
  void free(void* p, size_t, int s) override { check(cudaFreeAsync(p, streams[s]), "cudaFreeAsync"); }
};

// No allocator: one preallocated buffer per stream (kernels on one stream run in order).
struct NoAlloc final : Allocator {
  std::vector<void*> buffers;
  size_t bytes;
  explicit NoAlloc(size_t b) : bytes(b) {}
  ~NoAlloc() override { unbind(); }
  const char* name() const override { return "none"; }
  void bind(const std::vector<cudaStream_t>& ss) override
  {
    unbind();
    for (size_t i = 0; i < ss.size(); ++i) {
      void* p;
      check(cudaMalloc(&p, bytes), "cudaMalloc");
      buffers.push_back(p);
    }
  }
  void unbind() override
  {
    for (auto p : buffers) {
      cudaFree(p);
    }
    buffers.clear();
  }
  void* alloc(size_t, int s) override { return buffers[s]; }
  void free(void*, size_t, int) override {}
};

// How a kernels run starts (see the top of this file).
enum class Start { Warm, Fresh, Empty };
const char* start_name(Start s)
{
  return s == Start::Warm ? "warm" : s == Start::Fresh ? "fresh" : "empty";
}

std::unique_ptr<Allocator> make(const std::string& name, Start start, size_t none_bytes)
{
  size_t initial = start == Start::Empty ? 0 : kInitialBytes;
  if (name == "ferrio") { return std::make_unique<FerrioAlloc>(initial); }
  if (name == "rmm-pool") {
    try {
      return std::make_unique<RmmAlloc>(initial);
    } catch (std::exception const&) {
      if (initial != 0) { throw; }
      // In case this RMM refuses an empty initial pool: the smallest one it accepts.
      return std::make_unique<RmmAlloc>(256);
    }
  }
  if (name == "cuMemAllocAsync") { return std::make_unique<AsyncAlloc>(start != Start::Empty); }
  if (name == "none") { return std::make_unique<NoAlloc>(none_bytes); }
  die("unknown allocator " + name);
}

std::vector<cudaStream_t> make_streams(int n)
{
  std::vector<cudaStream_t> ss(n);
  for (auto& s : ss) {
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  return ss;
}

void destroy_streams(std::vector<cudaStream_t>& ss)
{
  for (auto s : ss) {
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    check(cudaStreamDestroy(s), "cudaStreamDestroy");
  }
  ss.clear();
}

// ---- the spin kernel, PTX loaded through the driver API -----------------------------------

// spin(ns, out): one warp spins on %globaltimer for `ns` nanoseconds, then thread 0 writes the
// time spun to *out (so the kernel touches the allocated memory). Checked with ptxas for sm_90.
const char* kSpinPtx = R"(
.version 8.0
.target sm_90
.address_size 64

.visible .entry spin(
    .param .u64 spin_ns,
    .param .u64 out
)
{
    .reg .pred %p<3>;
    .reg .b64 %rd<8>;
    .reg .b32 %r<2>;

    ld.param.u64 %rd1, [spin_ns];
    ld.param.u64 %rd2, [out];
    mov.u64 %rd3, %globaltimer;
LOOP:
    mov.u64 %rd4, %globaltimer;
    sub.u64 %rd5, %rd4, %rd3;
    setp.lt.u64 %p1, %rd5, %rd1;
    @%p1 bra LOOP;
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p2, %r1, 0;
    @%p2 bra DONE;
    cvta.to.global.u64 %rd6, %rd2;
    st.global.u64 [%rd6], %rd5;
DONE:
    ret;
}
)";

struct Driver {
  CUresult (*module_load_data)(CUmodule*, const void*);
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*);
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void**, void**);
  CUfunction spin = nullptr;

  Driver()
  {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) { die(std::string("dlopen libcuda.so.1: ") + dlerror()); }
    module_load_data    = reinterpret_cast<decltype(module_load_data)>(dlsym(lib, "cuModuleLoadData"));
    module_get_function = reinterpret_cast<decltype(module_get_function)>(dlsym(lib, "cuModuleGetFunction"));
    launch_kernel       = reinterpret_cast<decltype(launch_kernel)>(dlsym(lib, "cuLaunchKernel"));
    if (!module_load_data || !module_get_function || !launch_kernel) { die("driver symbols missing"); }
    CUmodule m;
    if (CUresult r = module_load_data(&m, kSpinPtx); r != CUDA_SUCCESS) {
      die("cuModuleLoadData of the spin kernel failed: " + std::to_string(r));
    }
    if (CUresult r = module_get_function(&spin, m, "spin"); r != CUDA_SUCCESS) {
      die("cuModuleGetFunction failed: " + std::to_string(r));
    }
  }

  void launch(void* out, uint64_t ns, cudaStream_t s) const
  {
    void* args[] = {&ns, &out};
    if (CUresult r = launch_kernel(spin, 1, 1, 1, 32, 1, 1, 0, reinterpret_cast<CUstream>(s), args, nullptr);
        r != CUDA_SUCCESS) {
      die("cuLaunchKernel failed: " + std::to_string(r));
    }
  }
};

// ---- scenarios ----------------------------------------------------------------------------

struct Json {
  FILE* f = nullptr;
  void line(const std::string& s)
  {
    if (f != nullptr) {
      std::fprintf(f, "%s\n", s.c_str());
      std::fflush(f);
    }
  }
};

uint64_t xorshift(uint64_t& x)
{
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  return x * 0x2545F4914F6CDD1DULL;
}

double contention(Allocator& a, int threads, int nstreams, double seconds)
{
  auto streams = make_streams(nstreams);
  a.bind(streams);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> total{0};
  std::barrier start(threads + 1);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      check(cudaSetDevice(0), "cudaSetDevice");
      int s    = t % nstreams;
      uint64_t rng = 0x9E3779B97F4A7C15ULL ^ (uint64_t(t + 1) << 17);
      void* live[kLive]     = {};
      size_t sizes[kLive] = {};
      uint64_t n          = 0;
      start.arrive_and_wait();
      while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 256; ++i, ++n) {
          int slot = int(n % kLive);
          if (live[slot] != nullptr) { a.free(live[slot], sizes[slot], s); }
          sizes[slot] = kSizes[xorshift(rng) % (sizeof(kSizes) / sizeof(kSizes[0]))];
          live[slot]  = a.alloc(sizes[slot], s);
        }
      }
      for (int slot = 0; slot < kLive; ++slot) {
        if (live[slot] != nullptr) { a.free(live[slot], sizes[slot], s); }
      }
      total.fetch_add(n);
    });
  }
  start.arrive_and_wait();
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : ts) {
    th.join();
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  a.unbind();
  destroy_streams(streams);
  return double(total.load()) / secs;
}

struct KernelResult {
  double wall_ms, ideal_ms, alloc_us, free_us, max_alloc_us;
  double first_alloc_us;  // the slowest of the streams' first allocations
};

KernelResult kernels(Allocator& a, const Driver& d, int nstreams, int per_stream, uint64_t spin_ns,
                     size_t bytes, bool warmup)
{
  auto streams = make_streams(nstreams);
  a.bind(streams);
  auto round = [&](bool timed) {
    std::atomic<uint64_t> alloc_ns{0}, free_ns{0}, max_alloc_ns{0}, max_first_ns{0};
    std::barrier start(nstreams + 1);
    std::vector<std::thread> ts;
    for (int s = 0; s < nstreams; ++s) {
      ts.emplace_back([&, s] {
        check(cudaSetDevice(0), "cudaSetDevice");
        uint64_t a_ns = 0, f_ns = 0, a_max = 0, a_first = 0;
        start.arrive_and_wait();
        for (int k = 0; k < per_stream; ++k) {
          auto t0 = Clock::now();
          void* p = a.alloc(bytes, s);
          auto t1 = Clock::now();
          d.launch(p, spin_ns, streams[s]);
          auto t2 = Clock::now();
          a.free(p, bytes, s);
          auto t3 = Clock::now();
          uint64_t an = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
          a_ns += an;
          a_max = std::max(a_max, an);
          if (k == 0) { a_first = an; }
          f_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t3 - t2).count();
        }
        check(cudaStreamSynchronize(streams[s]), "cudaStreamSynchronize");
        alloc_ns += a_ns;
        free_ns += f_ns;
        uint64_t m = max_alloc_ns.load();
        while (a_max > m && !max_alloc_ns.compare_exchange_weak(m, a_max)) {}
        uint64_t f = max_first_ns.load();
        while (a_first > f && !max_first_ns.compare_exchange_weak(f, a_first)) {}
      });
    }
    start.arrive_and_wait();
    auto t0 = Clock::now();
    for (auto& th : ts) {
      th.join();
    }
    double wall = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    double calls = double(nstreams) * per_stream;
    (void)timed;
    return KernelResult{wall, double(per_stream) * double(spin_ns) / 1e6,
                        double(alloc_ns.load()) / calls / 1e3, double(free_ns.load()) / calls / 1e3,
                        double(max_alloc_ns.load()) / 1e3, double(max_first_ns.load()) / 1e3};
  };
  if (warmup) { round(false); }
  KernelResult r = round(true);
  a.unbind();
  destroy_streams(streams);
  return r;
}

std::vector<int> ints(const char* s)
{
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    v.push_back(std::stoi(item));
  }
  return v;
}

std::vector<std::string> words(const char* s)
{
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    v.push_back(item);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv)
{
  double seconds            = 0.3;
  std::vector<int> threads  = {1, 4, 16};
  std::vector<int> nstreams = {1, 4, 16};
  std::vector<int> kstreams = {1, 4, 8, 16, 32};
  std::vector<int> kernels_per = {4, 32};
  double spin_us            = 40;
  size_t kernel_bytes       = 1u << 20;
  std::string only          = "all";
  int repeats               = 5;
  std::vector<std::string> allocators = {"ferrio", "rmm-pool", "cuMemAllocAsync"};
  std::vector<std::string> starts     = {"warm", "fresh", "empty"};
  Json json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next     = [&]() -> const char* {
      if (i + 1 >= argc) { die("missing value for " + a); }
      return argv[++i];
    };
    if (a == "--seconds") { seconds = std::atof(next()); }
    else if (a == "--threads") { threads = ints(next()); }
    else if (a == "--streams") { nstreams = ints(next()); }
    else if (a == "--kernel-streams") { kstreams = ints(next()); }
    else if (a == "--kernels") { kernels_per = ints(next()); }
    else if (a == "--spin-us") { spin_us = std::atof(next()); }
    else if (a == "--only") { only = next(); }
    else if (a == "--repeat") { repeats = std::max(1, std::atoi(next())); }
    else if (a == "--allocators") { allocators = words(next()); }
    else if (a == "--starts") { starts = words(next()); }
    else if (a == "--grow-mib") { grow_bytes = size_t(std::atoi(next())) << 20; }
    else if (a == "--json") {
      json.f = std::fopen(next(), "w");
      if (json.f == nullptr) { die("cannot open the JSON file"); }
    } else {
      die("usage: pool_bench [--seconds S] [--threads 1,4,16] [--streams 1,4,16] "
          "[--kernel-streams 1,4,8,16,32] [--kernels 4,32] [--spin-us 40] [--repeat 5] "
          "[--only contention|kernels|all] [--allocators ferrio,rmm-pool,cuMemAllocAsync] "
          "[--starts warm,fresh,empty] [--grow-mib 32] [--json PATH]");
    }
  }
  try {
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaFree(nullptr), "cudaFree(0)");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    int driver = 0;
    check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
    std::printf("# %s, driver API %d, %u host threads\n", prop.name, driver,
                std::thread::hardware_concurrency());

    if (only == "all" || only == "contention") {
      std::printf("# contention: %.2f s per run, %d live blocks per thread, sizes 256 B..256 KiB, "
                  "thread t on stream t %% S\n",
                  seconds, kLive);
      std::printf("%-16s %7s %7s %14s\n", "allocator", "threads", "streams", "pairs/s");
      for (auto& name : allocators) {
        std::unique_ptr<Allocator> a;
        try {
          a = make(name, Start::Warm, 0);
          contention(*a, 1, 1, 0.05);  // warm up: first-touch of streams, per-thread state
        } catch (std::exception const& e) {
          std::printf("%-16s failed: %s\n", name.c_str(), e.what());
          continue;
        }
        for (int t : threads) {
          for (int s : nstreams) {
            double rate = 0;
            try {
              rate = contention(*a, t, s, seconds);
            } catch (std::exception const& e) {
              std::printf("%-16s %7d %7d failed: %s\n", name.c_str(), t, s, e.what());
              continue;
            }
            std::printf("%-16s %7d %7d %14.0f\n", name.c_str(), t, s, rate);
            std::fflush(stdout);
            std::ostringstream j;
            j << R"({"scenario":"contention","allocator":")" << name << R"(","threads":)" << t
              << R"(,"streams":)" << s << R"(,"seconds":)" << seconds << R"(,"pairs_per_s":)"
              << rate << "}";
            json.line(j.str());
          }
        }
      }
    }

    if (only == "all" || only == "kernels") {
      Driver d;
      uint64_t spin_ns = uint64_t(spin_us * 1000.0);
      std::printf("# kernels: one host thread per stream, each kernel a %.0f us spin on a %zu-byte "
                  "block allocated before it and freed after it on its stream\n",
                  spin_us, kernel_bytes);
      std::printf("# ferrio grows by %zu MiB\n", grow_bytes >> 20);
      std::printf("%-16s %5s %7s %7s %10s %10s %8s %10s %10s %12s %s\n", "allocator", "start",
                  "streams", "kernels", "wall_ms", "ideal_ms", "overlap", "alloc_us", "free_us",
                  "max_alloc_us", "overlap_q1-q3", "first_alloc_us");
      std::vector<std::string> all = {"none"};
      all.insert(all.end(), allocators.begin(), allocators.end());
      // Each configuration `repeats` times, the allocators taking turns within a repetition
      // (launch timing from many threads swings a single run by 2-5x); reported: the median
      // wall time (and the overlap it gives), the median of the mean allocate/free times, and
      // the worst allocate of all repetitions.
      for (Start start : {Start::Warm, Start::Fresh, Start::Empty}) {
        const char* sn = start_name(start);
        if (std::find(starts.begin(), starts.end(), sn) == starts.end()) { continue; }
        for (int n : kstreams) {
          for (int k : kernels_per) {
            std::vector<std::vector<KernelResult>> runs(all.size());
            std::vector<std::string> failed(all.size());
            for (int rep = 0; rep < repeats; ++rep) {
              for (size_t i = 0; i < all.size(); ++i) {
                if (!failed[i].empty()) { continue; }
                try {
                  auto a = make(all[i], start, kernel_bytes);
                  runs[i].push_back(
                    kernels(*a, d, n, k, spin_ns, kernel_bytes, start == Start::Warm));
                } catch (std::exception const& e) {
                  failed[i] = e.what();
                }
              }
            }
            for (size_t i = 0; i < all.size(); ++i) {
              auto const& name = all[i];
              if (!failed[i].empty()) {
                std::printf("%-16s %5s %7d %7d failed: %s\n", name.c_str(), sn, n, k,
                            failed[i].c_str());
                continue;
              }
              auto med = [&](auto field) {
                std::vector<double> v;
                for (auto const& r : runs[i]) { v.push_back(field(r)); }
                std::sort(v.begin(), v.end());
                size_t m = v.size() / 2;
                return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
              };
              KernelResult r{};
              r.wall_ms  = med([](KernelResult const& x) { return x.wall_ms; });
              r.ideal_ms = runs[i].front().ideal_ms;
              r.alloc_us = med([](KernelResult const& x) { return x.alloc_us; });
              r.free_us  = med([](KernelResult const& x) { return x.free_us; });
              for (auto const& x : runs[i]) { r.max_alloc_us = std::max(r.max_alloc_us, x.max_alloc_us); }
              r.first_alloc_us = med([](KernelResult const& x) { return x.first_alloc_us; });
              // The spread: overlap of the runs at the first and third quartile of wall time.
              std::vector<double> walls;
              for (auto const& x : runs[i]) { walls.push_back(x.wall_ms); }
              std::sort(walls.begin(), walls.end());
              double q1 = walls[walls.size() / 4], q3 = walls[(3 * walls.size()) / 4];
              std::printf("%-16s %5s %7d %7d %10.3f %10.3f %7.0f%% %10.2f %10.2f %12.2f %4.0f-%.0f%% %10.2f\n",
                          name.c_str(), sn, n, k, r.wall_ms, r.ideal_ms,
                          100.0 * r.ideal_ms / r.wall_ms, r.alloc_us, r.free_us, r.max_alloc_us,
                          100.0 * r.ideal_ms / q3, 100.0 * r.ideal_ms / q1, r.first_alloc_us);
              std::fflush(stdout);
              std::ostringstream j;
              j << R"({"scenario":"kernels","allocator":")" << name << R"(","start":")" << sn
                << R"(","prewarmed":)" << (start == Start::Warm ? "true" : "false")
                << R"(,"streams":)" << n << R"(,"kernels_per_stream":)" << k
                << R"(,"repeats":)" << runs[i].size() << R"(,"spin_us":)" << spin_us
                << R"(,"wall_ms":)" << r.wall_ms << R"(,"wall_ms_q1":)" << q1
                << R"(,"wall_ms_q3":)" << q3 << R"(,"grow_mib":)" << (grow_bytes >> 20)
                << R"(,"ideal_ms":)" << r.ideal_ms
                << R"(,"alloc_us_mean":)" << r.alloc_us << R"(,"free_us_mean":)" << r.free_us
                << R"(,"alloc_us_max":)" << r.max_alloc_us
                << R"(,"first_alloc_us_median":)" << r.first_alloc_us << "}";
              json.line(j.str());
            }
          }
        }
      }
    }
  } catch (std::exception const& e) {
    die(e.what());
  }
  if (json.f != nullptr) { std::fclose(json.f); }
  return 0;
}
