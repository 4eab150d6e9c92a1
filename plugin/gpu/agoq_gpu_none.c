/* The GPU layer of a build without CUDA (AGOQ_CUDA=OFF or no toolkit): AGOQ_GPU=on fails
 * init with the reason, auto and off keep the host path. Every link call is unreachable
 * (no device memory is ever registered) and fails loudly if reached. */
#include <stdio.h>
#include <string.h>

#include "core/agoq_check.h"
#include "core/agoq_params.h"
#include "gpu/agoq_gpu.h"

static const char agoq_gpu_none_why[] = "off: this build of agoq has no CUDA support (built without the toolkit)";

const char* agoq_gpu_backend(void) { return "none"; }

ncclResult_t agoq_gpu_init(void) {
  if (agoq_param_int(AGOQ_PARAM_GPU) == AGOQ_GPU_MODE_ON) {
    AGOQ_WARN("AGOQ_GPU=on but the GPU data path cannot start: %s", agoq_gpu_none_why + 5);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

bool agoq_gpu_active(void) { return false; }
const char* agoq_gpu_describe(void) { return agoq_gpu_none_why; }

ncclResult_t agoq_gpu_range_check(const void* p, size_t size, int* device, char* why, size_t why_len) {
  (void)p;
  (void)size;
  *device = -1;
  snprintf(why, why_len, "%s", agoq_gpu_none_why + 5);
  return ncclInvalidUsage;
}

static ncclResult_t agoq_gpu_none_call(const char* what) {
  AGOQ_WARN("%s called in a build without CUDA", what);
  return ncclInternalError;
}

ncclResult_t agoq_gpu_link_create(int device, const agoq_gpu_link_config* cfg, agoq_gpu_link** out) {
  (void)device;
  (void)cfg;
  *out = NULL;
  return agoq_gpu_none_call("agoq_gpu_link_create");
}
void agoq_gpu_link_destroy(agoq_gpu_link* l) { (void)l; }
void agoq_gpu_link_quiesce(agoq_gpu_link* l) { (void)l; }
int agoq_gpu_link_device(const agoq_gpu_link* l) { (void)l; return -1; }
agoq_gpu_ring* agoq_gpu_link_ring(agoq_gpu_link* l) { (void)l; return NULL; }
agoq_gpu_pool* agoq_gpu_link_pool(agoq_gpu_link* l) { (void)l; return NULL; }
/* No link exists without CUDA, so no pool either. */
bool agoq_gpu_pool_get(agoq_gpu_pool* p, size_t size, agoq_gpu_pool_piece* piece) {
  (void)p; (void)size;
  piece->ptr = NULL; piece->size = 0; piece->chunk = -1;
  return false;
}
void agoq_gpu_pool_put(agoq_gpu_pool* p, agoq_gpu_pool_piece* piece) { (void)p; piece->chunk = -1; }
void* agoq_gpu_pool_key(agoq_gpu_pool* p, const agoq_gpu_pool_piece* piece, int net_dev) {
  (void)p; (void)piece; (void)net_dev;
  return NULL;
}
size_t agoq_gpu_pool_chunk_size(const agoq_gpu_pool* p) { (void)p; return 0; }
void agoq_gpu_pool_stats_get(int device, agoq_gpu_pool_stats* s) {
  (void)device;
  memset(s, 0, sizeof *s);
}
const agoq_gpu_link_stats* agoq_gpu_link_stats_get(const agoq_gpu_link* l) { (void)l; return NULL; }
ncclResult_t agoq_gpu_copy_d2h(agoq_gpu_link* l, void* host, const void* dev, size_t size) {
  (void)l; (void)host; (void)dev; (void)size;
  return agoq_gpu_none_call("agoq_gpu_copy_d2h");
}
ncclResult_t agoq_gpu_copy_h2d(agoq_gpu_link* l, void* dev, const void* host, size_t size) {
  (void)l; (void)host; (void)dev; (void)size;
  return agoq_gpu_none_call("agoq_gpu_copy_h2d");
}
ncclResult_t agoq_gpu_copy_h2d_flags_last(agoq_gpu_link* l, void* dev, const void* host, size_t size) {
  (void)l; (void)host; (void)dev; (void)size;
  return agoq_gpu_none_call("agoq_gpu_copy_h2d_flags_last");
}
ncclResult_t agoq_gpu_mark(agoq_gpu_link* l, uint32_t slot) {
  (void)l; (void)slot;
  return agoq_gpu_none_call("agoq_gpu_mark");
}
ncclResult_t agoq_gpu_poll(agoq_gpu_link* l, uint32_t slot, bool* done) {
  (void)l; (void)slot;
  *done = false;
  return agoq_gpu_none_call("agoq_gpu_poll");
}
ncclResult_t agoq_gpu_link_alloc(agoq_gpu_link* l, bool device, size_t size, void** p) {
  (void)l; (void)device; (void)size;
  *p = NULL;
  return agoq_gpu_none_call("agoq_gpu_link_alloc");
}
ncclResult_t agoq_gpu_frame_encode(agoq_gpu_link* l, uint32_t slot, int part, const agoq_codec_params* p,
                                   const void* src, size_t n, void* frame, size_t cap) {
  (void)l; (void)slot; (void)part; (void)p; (void)src; (void)n; (void)frame; (void)cap;
  return agoq_gpu_none_call("agoq_gpu_frame_encode");
}
ncclResult_t agoq_gpu_dequantize(agoq_gpu_link* l, uint32_t slot, int part, const agoq_codec_params* p,
                                 const void* body, size_t body_len, size_t n, agoq_dtype out, void* dst) {
  (void)l; (void)slot; (void)part; (void)p; (void)body; (void)body_len; (void)n; (void)out; (void)dst;
  return agoq_gpu_none_call("agoq_gpu_dequantize");
}
ncclResult_t agoq_gpu_frame_encode_batch(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                         const agoq_gpu_encode_item* items, size_t k) {
  (void)l; (void)slot; (void)part0; (void)p; (void)items; (void)k;
  return agoq_gpu_none_call("agoq_gpu_frame_encode_batch");
}
ncclResult_t agoq_gpu_dequantize_batch(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                       const agoq_gpu_decode_item* items, size_t k, agoq_dtype out) {
  (void)l; (void)slot; (void)part0; (void)p; (void)items; (void)k; (void)out;
  return agoq_gpu_none_call("agoq_gpu_dequantize_batch");
}
ncclResult_t agoq_gpu_dequantize_sum(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                     const agoq_gpu_decode_item* items, size_t k, size_t n, float* acc) {
  (void)l; (void)slot; (void)part0; (void)p; (void)items; (void)k; (void)n; (void)acc;
  return agoq_gpu_none_call("agoq_gpu_dequantize_sum");
}
ncclResult_t agoq_gpu_dequantize_sums(agoq_gpu_link* l, uint32_t slot, int part0, const agoq_codec_params* p,
                                      const agoq_gpu_decode_item* items, size_t k, const agoq_gpu_sum_group* groups,
                                      size_t ngroups) {
  (void)l; (void)slot; (void)part0; (void)p; (void)items; (void)k; (void)groups; (void)ngroups;
  return agoq_gpu_none_call("agoq_gpu_dequantize_sums");
}
ncclResult_t agoq_gpu_overflow_to_inf(agoq_gpu_link* l, agoq_dtype out, float* acc, size_t n) {
  (void)l; (void)out; (void)acc; (void)n;
  return agoq_gpu_none_call("agoq_gpu_overflow_to_inf");
}
ncclResult_t agoq_gpu_narrow(agoq_gpu_link* l, agoq_dtype out, const float* acc, size_t n, void* dst) {
  (void)l; (void)out; (void)acc; (void)n; (void)dst;
  return agoq_gpu_none_call("agoq_gpu_narrow");
}
void agoq_gpu_codec_result(const agoq_gpu_link* l, uint32_t slot, int part, uint32_t* status, uint64_t* body_len) {
  (void)l; (void)slot; (void)part;
  *status = AGOQ_CODEC_EARG;
  if (body_len != NULL) *body_len = 0;
}
uint64_t agoq_gpu_codec_ns_take(agoq_gpu_link* l) { (void)l; return 0; }
void agoq_gpu_note_encoded(agoq_gpu_link* l, uint64_t frame_bytes) { (void)l; (void)frame_bytes; }

bool agoq_gpu_link_rdma_flush(const agoq_gpu_link* l) {
  (void)l;
  return false;
}
ncclResult_t agoq_gpu_flush_rdma_writes(agoq_gpu_link* l) {
  (void)l;
  return agoq_gpu_none_call("agoq_gpu_flush_rdma_writes");
}
