/* A stand-in libcuda.so.1 for testing tecomp's CUDA runtime (tecomp/runtime/cuda.py) through
   the real cuda-bindings on machines without a GPU: cuda-bindings dlopens "libcuda.so.1" and
   fetches every entry point with cuGetProcAddress_v2, so a library with that soname on
   LD_LIBRARY_PATH stands in for the driver. "Device memory" is malloc'd host memory, kernels
   are C functions chosen by name, launches run at once. Calls that need a current context
   fail with CUDA_ERROR_INVALID_CONTEXT unless one was pushed, so push/pop pairing is checked.
   Knobs: FAKE_CUDA_INIT=<CUresult> makes cuInit fail; FAKE_CUDA_DEVICES=<n> sets the count.
   Built by tests/runtime/test_cuda_runtime.py with gcc. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;
#define OK 0
#define INVALID_VALUE 1
#define NOT_INITIALIZED 3
#define INVALID_CONTEXT 201
#define INVALID_PTX 218
#define NOT_FOUND 500
#define ILLEGAL_ADDRESS 700

static int inited, depth, sticky;
static int ctx_token = 42;
static char module_token;
static double ev_times[64]; static int n_events;
static struct { void *p; size_t n; } allocs[4096]; static int n_allocs;

/* what the last launch got (the test reads it through ctypes) */
struct last_launch { uint32_t grid[3], block[3], shared; int nparams; uint64_t params[8]; int launches; int allocs_live; int depth; };
struct last_launch fake_last;

int fake_ctx_depth(void) { return depth; }  /* contexts pushed and not popped */
static int want_ctx(void) { return inited && depth > 0; }
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }

CUresult cuGetErrorString(CUresult e, const char **s) {
  switch (e) {
    case INVALID_PTX: *s = "a PTX JIT compilation failed"; return OK;
    case ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; return OK;
    case NOT_FOUND: *s = "named symbol not found"; return OK;
    case INVALID_CONTEXT: *s = "invalid device context"; return OK;
    case INVALID_VALUE: *s = "invalid argument"; return OK;
    default: *s = "unknown error"; return OK;
  }
}
CUresult cuGetErrorName(CUresult e, const char **s) { *s = "CUDA_ERROR"; return OK; }
CUresult cuInit(unsigned f) { const char *v = getenv("FAKE_CUDA_INIT"); if (v && atoi(v)) return atoi(v); inited = 1; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { const char *v = getenv("FAKE_CUDA_DEVICES"); *n = v ? atoi(v) : 1; return inited ? OK : NOT_INITIALIZED; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return OK; }
CUresult cuDeviceGetName(char *name, int len, int dev) { strncpy(name, "Fake GPU", len); return OK; }
CUresult cuDeviceGetAttribute(int *v, int a, int dev) {
  switch (a) {
    case 1: *v = 1024; break; case 2: *v = 1024; break; case 3: *v = 1024; break; case 4: *v = 64; break;
    case 5: *v = 2147483647; break; case 6: *v = 65535; break; case 7: *v = 65535; break;
    case 8: *v = 49152; break; case 16: *v = 4; break; case 75: *v = 8; break; case 76: *v = 0; break;
    case 97: *v = 166912; break; default: return INVALID_VALUE;
  }
  return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = &ctx_token; return OK; }
CUresult cuCtxPushCurrent(void *ctx) { if (ctx != &ctx_token) return INVALID_CONTEXT; depth++; return OK; }
CUresult cuCtxPopCurrent(void **ctx) { if (depth <= 0) return INVALID_CONTEXT; depth--; if (ctx) *ctx = &ctx_token; return OK; }
CUresult cuCtxSynchronize(void) { return want_ctx() ? sticky : INVALID_CONTEXT; }
CUresult cuModuleLoadData(void **mod, const void *image) {
  if (!want_ctx()) return INVALID_CONTEXT;
  if (strstr((const char *)image, "INVALID")) return INVALID_PTX;
  *mod = &module_token; return OK;
}
CUresult cuModuleUnload(void *mod) { return OK; }
static const char *kernels[] = {"add_one", "record", "fault"};
CUresult cuModuleGetFunction(void **f, void *mod, const char *name) {
  if (!want_ctx()) return INVALID_CONTEXT;
  for (int i = 0; i < 3; i++) if (!strcmp(name, kernels[i])) { *f = (void *)kernels[i]; return OK; }
  return NOT_FOUND;
}
CUresult cuFuncSetAttribute(void *f, int a, int v) { return OK; }
CUresult cuMemAlloc(CUdeviceptr *p, size_t n) {
  if (!want_ctx()) return INVALID_CONTEXT;
  if (n == 0) return INVALID_VALUE;
  void *m = malloc(n); allocs[n_allocs].p = m; allocs[n_allocs++].n = n; fake_last.allocs_live++;
  *p = (CUdeviceptr)(uintptr_t)m; return OK;
}
CUresult cuMemFree(CUdeviceptr p) {
  for (int i = 0; i < n_allocs; i++) if (allocs[i].p == (void *)(uintptr_t)p) { free(allocs[i].p); allocs[i].p = 0; fake_last.allocs_live--; return OK; }
  return INVALID_VALUE;
}
CUresult cuMemcpyHtoD(CUdeviceptr d, const void *h, size_t n) { if (!want_ctx()) return INVALID_CONTEXT; memcpy((void *)(uintptr_t)d, h, n); return OK; }
CUresult cuMemcpyDtoH(void *h, CUdeviceptr d, size_t n) { if (!want_ctx()) return INVALID_CONTEXT; memcpy(h, (void *)(uintptr_t)d, n); return OK; }
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
  for (int i = 0; i < n_allocs; i++)
    if (allocs[i].p && (uintptr_t)allocs[i].p <= p && p < (uintptr_t)allocs[i].p + allocs[i].n) { *(int *)data = 0; return OK; }
  return INVALID_VALUE;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
  if (!want_ctx()) return INVALID_CONTEXT;
  if (sticky) return sticky;
  fake_last.grid[0] = gx; fake_last.grid[1] = gy; fake_last.grid[2] = gz;
  fake_last.block[0] = bx; fake_last.block[1] = by; fake_last.block[2] = bz;
  fake_last.shared = shared; fake_last.launches++; fake_last.depth = depth;
  const char *name = (const char *)f;
  if (!strcmp(name, "add_one")) {        /* (float *A, float *B, int64 n): B[i] = A[i] + 1 */
    float *A = (float *)(uintptr_t)*(uint64_t *)params[0], *B = (float *)(uintptr_t)*(uint64_t *)params[1];
    int64_t n = *(int64_t *)params[2];
    for (uint64_t b = 0; b < gx; b++) for (uint64_t t = 0; t < bx; t++) { int64_t i = b * bx + t; if (i < n) B[i] = A[i] + 1.0f; }
  } else if (!strcmp(name, "record")) {  /* keeps its 4 params: (void *X, void *Y, int64 m, int64 k) */
    fake_last.nparams = 4;
    for (int i = 0; i < 4; i++) fake_last.params[i] = *(uint64_t *)params[i];
  } else if (!strcmp(name, "fault")) {
    sticky = ILLEGAL_ADDRESS;
  }
  return OK;
}
CUresult cuStreamSynchronize(void *s) { return want_ctx() ? sticky : INVALID_CONTEXT; }
CUresult cuEventCreate(void **e, unsigned flags) { if (!want_ctx()) return INVALID_CONTEXT; *e = (void *)(uintptr_t)(++n_events); return OK; }
CUresult cuEventRecord(void *e, void *s) { ev_times[(uintptr_t)e % 64] = now_ms(); return OK; }
CUresult cuEventSynchronize(void *e) { return sticky; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { *ms = (float)(ev_times[(uintptr_t)b % 64] - ev_times[(uintptr_t)a % 64]); return OK; }
CUresult cuEventDestroy(void *e) { return OK; }

static struct { const char *name; void *fn; } table[] = {
#define E(f) {#f, (void *)f}
  E(cuGetErrorString), E(cuGetErrorName), E(cuInit), E(cuDriverGetVersion), E(cuDeviceGetCount), E(cuDeviceGet),
  E(cuDeviceGetName), E(cuDeviceGetAttribute), E(cuDevicePrimaryCtxRetain), E(cuCtxPushCurrent), E(cuCtxPopCurrent),
  E(cuCtxSynchronize), E(cuModuleLoadData), E(cuModuleUnload), E(cuModuleGetFunction), E(cuFuncSetAttribute),
  E(cuMemAlloc), E(cuMemFree), E(cuMemcpyHtoD), E(cuMemcpyDtoH), E(cuPointerGetAttribute), E(cuLaunchKernel),
  E(cuStreamSynchronize), E(cuEventCreate), E(cuEventRecord), E(cuEventSynchronize), E(cuEventElapsedTime),
  E(cuEventDestroy),
};
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status) {
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (!strcmp(sym, table[i].name)) { *pfn = table[i].fn; if (status) *status = 0; return OK; }
  *pfn = 0; if (status) *status = 1; return NOT_FOUND;
}
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, uint64_t flags) { return cuGetProcAddress_v2(sym, pfn, ver, flags, 0); }
