/*
 * What every scenario leans on: failure recording, the payload pattern and guard bytes,
 * and the plugin calls wrapped the way NCCL's proxy makes them (connect/accept polled
 * with the same handle buffer, NULL requests retried, test() polled oldest-first).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi_harness.h"
#include "core/agoq_log.h"

void abi_fail(abi_worker* w, const char* file, int line, const char* fmt, ...) {
  /* The first failure is the cause; later ones are usually its consequences. */
  if (w->failed) return;
  w->failed = true;
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  int off = snprintf(w->why, sizeof(w->why), "%s:%d: ", base, line);
  if (off < 0 || (size_t)off >= sizeof(w->why)) off = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->why + off, sizeof(w->why) - (size_t)off, fmt, ap);
  va_end(ap);
  fprintf(stderr, "abi[v%d %s role %d] FAIL %s\n", w->view.version, w->sc ? w->sc->name : "?",
          w->role, w->why);
}

const char* abi_result_str(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "(unknown ncclResult_t)";
  }
}

/* ---- pattern ---- */

static inline uint64_t abi_mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The pattern moves in aligned 64-bit words where the buffer allows: one instrumented load
 * or store per word under the sanitizers, where a memcpy or memcmp per word goes through
 * their range checks (a 1 GiB message took 48 s of one TSan test that way). */
typedef uint64_t abi_word __attribute__((may_alias));

void abi_pattern_fill(void* buf, size_t size, uint64_t seed) {
  uint8_t* p = buf;
  uint64_t key = abi_mix(seed);
  size_t words = size / 8;
  if (((uintptr_t)p & 7) == 0) {
    abi_word* w = (abi_word*)p;
    for (size_t i = 0; i < words; i++) w[i] = abi_mix(key + i);
  } else {
    for (size_t i = 0; i < words; i++) {
      uint64_t v = abi_mix(key + i);
      memcpy(p + i * 8, &v, 8);
    }
  }
  if (size % 8) {
    uint64_t v = abi_mix(key + words);
    memcpy(p + words * 8, &v, size % 8);
  }
}

size_t abi_pattern_check(const void* buf, size_t size, uint64_t seed) {
  const uint8_t* p = buf;
  uint64_t key = abi_mix(seed);
  size_t words = size / 8;
  size_t i = 0;
  if (((uintptr_t)p & 7) == 0) {
    const abi_word* w = (const abi_word*)p;
    while (i < words && w[i] == abi_mix(key + i)) i++;
  }
  for (; i <= words; i++) {
    size_t n = i < words ? 8 : size % 8;
    if (n == 0) break;
    uint64_t v = abi_mix(key + i);
    if (memcmp(p + i * 8, &v, n) != 0) {
      const uint8_t* e = (const uint8_t*)&v;
      for (size_t k = 0; k < n; k++)
        if (p[i * 8 + k] != e[k]) return i * 8 + k;
    }
  }
  return SIZE_MAX;
}

/* ---- guarded buffers ---- */

int abi_buf_alloc(abi_buf* b, size_t size) {
  b->base = malloc(size + 2 * ABI_GUARD_SIZE);
  if (b->base == NULL) return -1;
  b->data = b->base + ABI_GUARD_SIZE;
  b->size = size;
  memset(b->base, ABI_GUARD_BYTE, ABI_GUARD_SIZE);
  memset(b->data + size, ABI_GUARD_BYTE, ABI_GUARD_SIZE);
  if (abi_device_mode() && abi_device_alloc(b) != 0) {
    free(b->base);
    memset(b, 0, sizeof(*b));
    return -1;
  }
  return 0;
}

void abi_buf_free(abi_buf* b) {
  if (b->base != NULL && abi_device_mode()) abi_device_free(b);
  free(b->base);
  memset(b, 0, sizeof(*b));
}

int abi_buf_guard_check(const abi_buf* b, char* what, size_t cap) {
  for (size_t i = 0; i < ABI_GUARD_SIZE; i++) {
    if (b->base[i] != ABI_GUARD_BYTE) {
      snprintf(what, cap, "guard byte %zu before the buffer overwritten (0x%02x)",
               ABI_GUARD_SIZE - i, b->base[i]);
      return -1;
    }
  }
  for (size_t i = 0; i < ABI_GUARD_SIZE; i++) {
    if (b->data[b->size + i] != ABI_GUARD_BYTE) {
      snprintf(what, cap, "guard byte %zu after the %zu-byte buffer overwritten (0x%02x)", i,
               b->size, b->data[b->size + i]);
      return -1;
    }
  }
  return 0;
}

/* ---- worker lifecycle ---- */

int abi_worker_setup(abi_worker* w, const char* lib_path, int version) {
  char err[512] = "";
  w->lib_path = lib_path;
  if (agoq_netlib_open(lib_path, &w->lib, err, sizeof(err)) != 0) {
    abi_fail(w, __FILE__, __LINE__, "cannot open %s: %s", lib_path, err);
    return -1;
  }
  if (agoq_netlib_net_view(w->lib, version, &w->view) != 0) {
    abi_fail(w, __FILE__, __LINE__, "no net v%d table in %s", version, lib_path);
    return -1;
  }
  ABI_NCCL_OK(w, agoq_view_init(&w->view, &w->ctx, w->comm_id, agoq_log_stderr));
  ABI_NCCL_OK(w, agoq_view_devices(&w->view, &w->ndev));
  ABI_REQUIRE(w, w->ndev > 0, "devices() reported %d devices", w->ndev);
  w->dev = 0;
  return 0;
fail:
  return -1;
}

void abi_worker_teardown(abi_worker* w) {
  if (w->lib == NULL) return;
  if (w->view.table != NULL) {
    ncclResult_t r = agoq_view_finalize(&w->view, w->ctx);
    if (r != ncclSuccess)
      abi_fail(w, __FILE__, __LINE__, "finalize returned %s", abi_result_str(r));
  }
  w->ctx = NULL;
  agoq_netlib_close(w->lib);
  w->lib = NULL;
}

/* ---- connection setup ---- */

/* The proxy does not spin flat out on a pending connection or request; neither do we,
 * so a plugin's own progress threads get the CPU on a 2-core runner. */
static void abi_backoff(unsigned* idle) {
  if (++*idle < 64) return;
  abi_sleep_us(*idle < 1024 ? 20 : 200);
}

int abi_listen_publish(abi_worker* w, void** listen_comm) {
  uint8_t handle[ABI_HANDLE_SIZE];
  memset(handle, 0, sizeof(handle));
  *listen_comm = NULL;
  ABI_NCCL_OK(w, agoq_view_listen(&w->view, w->ctx, w->dev, handle, listen_comm));
  ABI_REQUIRE(w, *listen_comm != NULL, "listen succeeded but returned a NULL listen comm");
  return abi_ctrl_send(w, ABI_MSG_HANDLE, handle, sizeof(handle));
fail:
  return -1;
}

int abi_handle_receive(abi_worker* w, void* handle) {
  return abi_ctrl_recv(w, ABI_MSG_HANDLE, handle, ABI_HANDLE_SIZE, 30000);
}

int abi_connect_poll(abi_worker* w, void* ctx, void* handle, void** send_comm, int timeout_ms) {
  int64_t deadline = abi_now_ms() + timeout_ms;
  unsigned idle = 0;
  *send_comm = NULL;
  for (;;) {
    ncclResult_t r = agoq_view_connect(&w->view, ctx, w->dev, handle, send_comm);
    ABI_REQUIRE(w, r == ncclSuccess, "connect returned %s", abi_result_str(r));
    if (*send_comm != NULL) return 0;
    ABI_REQUIRE(w, abi_now_ms() < deadline, "connect still pending after %d ms", timeout_ms);
    abi_backoff(&idle);
  }
fail:
  return -1;
}

int abi_accept_poll(abi_worker* w, void* listen_comm, void** recv_comm, int timeout_ms) {
  int64_t deadline = abi_now_ms() + timeout_ms;
  unsigned idle = 0;
  *recv_comm = NULL;
  for (;;) {
    ncclResult_t r = agoq_view_accept(&w->view, listen_comm, recv_comm);
    ABI_REQUIRE(w, r == ncclSuccess, "accept returned %s", abi_result_str(r));
    if (*recv_comm != NULL) return 0;
    ABI_REQUIRE(w, abi_now_ms() < deadline, "accept still pending after %d ms", timeout_ms);
    abi_backoff(&idle);
  }
fail:
  return -1;
}

int abi_pair_connect(abi_worker* w, void** comm) {
  *comm = NULL;
  if (w->role == 0) {
    void* lc = NULL;
    if (abi_listen_publish(w, &lc) != 0) return -1;
    int rc = abi_accept_poll(w, lc, comm, 20000);
    abi_close_listen(w, &lc);
    return w->failed ? -1 : rc;
  }
  uint8_t handle[ABI_HANDLE_SIZE];
  if (abi_handle_receive(w, handle) != 0) return -1;
  return abi_connect_poll(w, w->ctx, handle, comm, 20000);
}

int abi_pair_connect_both(abi_worker* w, void** send_comm, void** recv_comm) {
  void* lc = NULL;
  uint8_t handle[ABI_HANDLE_SIZE];
  *send_comm = *recv_comm = NULL;
  if (abi_listen_publish(w, &lc) != 0) return -1;
  if (abi_handle_receive(w, handle) != 0) goto fail;
  /* Like the proxy's service thread: both setups progress in one loop, since each side's
   * accept needs the other side's connect to move. */
  int64_t deadline = abi_now_ms() + 20000;
  unsigned idle = 0;
  while (*send_comm == NULL || *recv_comm == NULL) {
    if (*send_comm == NULL) {
      ncclResult_t r = agoq_view_connect(&w->view, w->ctx, w->dev, handle, send_comm);
      ABI_REQUIRE(w, r == ncclSuccess, "connect returned %s", abi_result_str(r));
    }
    if (*recv_comm == NULL) {
      ncclResult_t r = agoq_view_accept(&w->view, lc, recv_comm);
      ABI_REQUIRE(w, r == ncclSuccess, "accept returned %s", abi_result_str(r));
    }
    ABI_REQUIRE(w, abi_now_ms() < deadline, "connection setup pending after 20 s (send %p recv %p)",
                *send_comm, *recv_comm);
    abi_backoff(&idle);
  }
  abi_close_listen(w, &lc);
  return w->failed ? -1 : 0;
fail:
  if (lc != NULL) agoq_view_close_listen(&w->view, lc);
  return -1;
}

/* ---- registration and teardown ---- */

/* Device memory goes by DMA-BUF where the device advertises it, as NCCL does when the CUDA
 * driver supports dma-bufs: the fd of the buffer's allocation, closed right after the call. */
static int abi_reg_dmabuf(abi_worker* w, void* comm, void* p, size_t size, void** mhandle) {
  int fd = -1;
  uint64_t offset = 0;
  ABI_REQUIRE(w, abi_device_dmabuf(p, &fd, &offset) == 0, "no dma-buf for device buffer %p", p);
  ncclResult_t r = agoq_view_reg_mr_dmabuf(&w->view, comm, p, size, NCCL_PTR_CUDA, offset, fd, mhandle);
  close(fd);
  ABI_REQUIRE(w, r == ncclSuccess, "regMrDmaBuf(%zu B, NCCL_PTR_CUDA, offset %llu) returned %s", size,
              (unsigned long long)offset, abi_result_str(r));
  return 0;
fail:
  return -1;
}

int abi_reg(abi_worker* w, void* comm, void* data, size_t size, void** mhandle) {
  *mhandle = NULL;
  void* p = abi_device_ptr(data);
  int type = p != data ? NCCL_PTR_CUDA : NCCL_PTR_HOST;
  if (type == NCCL_PTR_CUDA && w->view.version >= 6) {
    agoq_view_props props;
    memset(&props, 0, sizeof props);
    ABI_NCCL_OK(w, agoq_view_get_properties(&w->view, 0, &props));
    if (props.ptr_support & NCCL_PTR_DMABUF) return abi_reg_dmabuf(w, comm, p, size, mhandle);
  }
  ncclResult_t r = agoq_view_reg_mr(&w->view, comm, p, size, type, mhandle);
  ABI_REQUIRE(w, r == ncclSuccess, "regMr(%zu B, %s) returned %s", size,
              type == NCCL_PTR_CUDA ? "NCCL_PTR_CUDA" : "NCCL_PTR_HOST", abi_result_str(r));
  return 0;
fail:
  return -1;
}

void abi_dereg(abi_worker* w, void* comm, void* mhandle) {
  if (comm == NULL || mhandle == NULL) return;
  ncclResult_t r = agoq_view_dereg_mr(&w->view, comm, mhandle);
  if (r != ncclSuccess) abi_fail(w, __FILE__, __LINE__, "deregMr returned %s", abi_result_str(r));
}

void abi_close_send(abi_worker* w, void** comm) {
  if (*comm == NULL) return;
  ncclResult_t r = agoq_view_close_send(&w->view, *comm);
  *comm = NULL;
  if (r != ncclSuccess)
    abi_fail(w, __FILE__, __LINE__, "closeSend returned %s", abi_result_str(r));
}

void abi_close_recv(abi_worker* w, void** comm) {
  if (*comm == NULL) return;
  ncclResult_t r = agoq_view_close_recv(&w->view, *comm);
  *comm = NULL;
  if (r != ncclSuccess)
    abi_fail(w, __FILE__, __LINE__, "closeRecv returned %s", abi_result_str(r));
}

void abi_close_listen(abi_worker* w, void** comm) {
  if (*comm == NULL) return;
  ncclResult_t r = agoq_view_close_listen(&w->view, *comm);
  *comm = NULL;
  if (r != ncclSuccess)
    abi_fail(w, __FILE__, __LINE__, "closeListen returned %s", abi_result_str(r));
}

/* ---- data path ---- */

ncclResult_t abi_net_isend(abi_worker* w, void* comm, void* data, size_t size, int tag, void* mh, void** req) {
  if (abi_device_push(data, size) != 0) {
    abi_fail(w, __FILE__, __LINE__, "copying %zu B to the device buffer failed", size);
    return ncclInternalError;
  }
  return agoq_view_isend(&w->view, comm, abi_device_ptr(data), size, tag, mh, req);
}

ncclResult_t abi_net_irecv(abi_worker* w, void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs,
                           void** req) {
  void* dev[ABI_MAX_RECVS];
  for (int i = 0; i < n && i < ABI_MAX_RECVS; i++) {
    /* The canary the scenario wrote goes to the device too: bytes past the message must
     * still hold it when the receive is done. */
    if (abi_device_push(data[i], sizes[i]) != 0) {
      abi_fail(w, __FILE__, __LINE__, "copying %zu B to the device buffer failed", sizes[i]);
      return ncclInternalError;
    }
    dev[i] = abi_device_ptr(data[i]);
  }
  ncclResult_t r = agoq_view_irecv(&w->view, comm, n, n <= ABI_MAX_RECVS ? dev : data, sizes, tags, mhs, req);
  if (r == ncclSuccess && *req != NULL && abi_device_mode() && abi_device_track_recv(*req, n, data, sizes) != 0) {
    abi_fail(w, __FILE__, __LINE__, "too many device receives in flight for the harness");
    return ncclInternalError;
  }
  return r;
}

int abi_isend(abi_worker* w, void* comm, void* data, size_t size, int tag, void* mh, void** req,
              int timeout_ms) {
  int64_t deadline = abi_now_ms() + timeout_ms;
  unsigned idle = 0;
  for (;;) {
    *req = NULL;
    ncclResult_t r = abi_net_isend(w, comm, data, size, tag, mh, req);
    ABI_REQUIRE(w, r == ncclSuccess, "isend(%zu B, tag %d) returned %s", size, tag,
                abi_result_str(r));
    if (*req != NULL) return 0;
    ABI_REQUIRE(w, abi_now_ms() < deadline, "isend kept returning a NULL request for %d ms",
                timeout_ms);
    abi_backoff(&idle);
  }
fail:
  return -1;
}

int abi_irecv(abi_worker* w, void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs,
              void** req, int timeout_ms) {
  int64_t deadline = abi_now_ms() + timeout_ms;
  unsigned idle = 0;
  for (;;) {
    *req = NULL;
    ncclResult_t r = abi_net_irecv(w, comm, n, data, sizes, tags, mhs, req);
    ABI_REQUIRE(w, r == ncclSuccess, "irecv(n=%d, %zu B) returned %s", n, sizes[0],
                abi_result_str(r));
    if (*req != NULL) return 0;
    ABI_REQUIRE(w, abi_now_ms() < deadline, "irecv kept returning a NULL request for %d ms",
                timeout_ms);
    abi_backoff(&idle);
  }
fail:
  return -1;
}

int abi_test_once(abi_worker* w, void* req, int* sizes) {
  int done = 0;
  ncclResult_t r = agoq_view_test(&w->view, req, &done, sizes);
  if (r != ncclSuccess) return -(int)r;
  if (done && abi_device_recv_done(req) != 0) return -(int)ncclInternalError;
  return done ? 1 : 0;
}

int abi_wait(abi_worker* w, void* req, int* sizes, int timeout_ms) {
  int64_t deadline = abi_now_ms() + timeout_ms;
  unsigned idle = 0;
  for (;;) {
    int rc = abi_test_once(w, req, sizes);
    ABI_REQUIRE(w, rc >= 0, "test returned %s", abi_result_str((ncclResult_t)-rc));
    if (rc == 1) return 0;
    ABI_REQUIRE(w, abi_now_ms() < deadline, "request not done after %d ms", timeout_ms);
    abi_backoff(&idle);
  }
fail:
  return -1;
}

static int abi_list_step(abi_worker* w, abi_reqlist* l, const char* which) {
  if (l == NULL || l->done == l->count) return 0;
  int rc = abi_test_once(w, l->req[l->done], l->sizes[l->done]);
  ABI_REQUIRE(w, rc >= 0, "test of %s request %d returned %s", which, l->done,
              abi_result_str((ncclResult_t)-rc));
  if (rc == 1) {
    l->done++;
    return 1;
  }
  return 0;
fail:
  return -1;
}

int abi_wait_lists(abi_worker* w, abi_reqlist* a, abi_reqlist* b, int timeout_ms) {
  int64_t deadline = abi_now_ms() + timeout_ms;
  unsigned idle = 0;
  for (;;) {
    bool a_left = a != NULL && a->done < a->count;
    bool b_left = b != NULL && b->done < b->count;
    if (!a_left && !b_left) return 0;
    int pa = abi_list_step(w, a, "first");
    int pb = abi_list_step(w, b, "second");
    if (pa < 0 || pb < 0) return -1;
    if (pa > 0 || pb > 0) {
      idle = 0;
      continue;
    }
    ABI_REQUIRE(w, abi_now_ms() < deadline, "requests not done after %d ms (%d/%d and %d/%d)",
                timeout_ms, a ? a->done : 0, a ? a->count : 0, b ? b->done : 0,
                b ? b->count : 0);
    abi_backoff(&idle);
  }
fail:
  return -1;
}
