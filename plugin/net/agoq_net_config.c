/* The plugin's configuration once per process, and the summary of what is in effect
 * (agoq_net_config.h). */
#include "net/agoq_net_config.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "agoq_codec.h"
#include "core/agoq_check.h"
#include "core/agoq_params.h"
#include "gpu/agoq_gpu.h"
#include "net/agoq_net_comm.h"

static struct {
  pthread_mutex_t mu;
  bool done;         /* a load ran; res is its outcome */
  ncclResult_t res;
  unsigned params_gen; /* agoq_params_generation() it ran with */
} agoq_net_config = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* What each transport and memory path has been run on. The TCP transport with host memory
 * has run inside NCCL on a GPU host (tools/gpu-check.sh, 2026-11-30 and 2026-12-04: nccl-tests,
 * PyTorch CollNet and typed p2p, Megatron-Core); the verbs transport only over the soft-RC
 * emulator; the GPU data path ran once, on an H200 (2026-12-04, docs/gpu-h200.md), and hung
 * there in known ways, which is why only AGOQ_GPU=on turns it on. Update when a run on
 * hardware says otherwise. */
static void agoq_effect_hardware(agoq_effect* e, bool verbs, bool gpu) {
  e->unvalidated = verbs || gpu;
  if (!e->unvalidated) {
    snprintf(e->hardware, sizeof e->hardware,
             "hardware: every path in use (TCP, host memory) has run inside NCCL on a GPU host");
    return;
  }
  snprintf(e->hardware, sizeof e->hardware, "%s%s%s",
           verbs ? "not yet run on hardware: the verbs transport (no real HCA; tested over agoq's emulator only)" : "",
           verbs && gpu ? "; " : "",
           gpu ? "known to hang on hardware: the GPU data path (one H200, 2026-12-04: the CollNet GPU reduction hung "
                 "under lazy module loading, and another thread's cudaFree blocks its copies; docs/gpu-h200.md); "
                 "AGOQ_GPU=auto or off keeps NCCL's buffers in host memory"
               : "");
}

static void agoq_effect_transport(agoq_effect* e) {
  if (agoq_net_tp == NULL) {
    snprintf(e->transport, sizeof e->transport, "transport: none (init failed)");
    return;
  }
  char devs[192] = "";
  size_t len = 0;
  int n = agoq_net_tp->ndevs();
  for (int d = 0; d < n && len + 1 < sizeof devs; d++) {
    agoq_tp_props p;
    const char* name = agoq_net_tp->get_properties(d, &p) == ncclSuccess && p.name != NULL ? p.name : "?";
    int w = snprintf(devs + len, sizeof devs - len, "%s%s", d ? ", " : "", name);
    len += w > 0 ? (size_t)w : 0;
  }
  /* The verbs transport is "ib" in AGOQ_TRANSPORT; users know it as verbs (InfiniBand or RoCE). */
  const char* name = strcmp(agoq_net_tp->name, "ib") == 0 ? "verbs" : agoq_net_tp->name;
  snprintf(e->transport, sizeof e->transport, "transport: %s on %.190s (%.150s)", name, devs,
           agoq_transport_reason());
}

/* "set" or "default": where a format came from, in a word. */
static const char* agoq_effect_source(agoq_param_id id) {
  return strcmp(agoq_param_source(id), "default") == 0 ? "the default" : "set";
}

static void agoq_effect_collnet(agoq_effect* e) {
  agoq_format f = (agoq_format)agoq_param_int(AGOQ_PARAM_FORMAT);
  if (f == AGOQ_FORMAT_NONE) {
    snprintf(e->collnet, sizeof e->collnet, "CollNet reductions: exact (AGOQ_FORMAT=none, %s)",
             agoq_effect_source(AGOQ_PARAM_FORMAT));
    return;
  }
  snprintf(e->collnet, sizeof e->collnet,
           "CollNet reductions: %s (block %s; AGOQ_FORMAT, %s) for fp32/bf16/fp16 Sum calls of at least %s, only "
           "where the job enables CollNet (NCCL_COLLNET_ENABLE=1 or ncclConfig_t.collnetEnable) and NCCL picks it; "
           "the rest exact%s",
           agoq_format_name(f), agoq_param_str(AGOQ_PARAM_BLOCK), agoq_effect_source(AGOQ_PARAM_FORMAT),
           agoq_param_str(AGOQ_PARAM_MIN_BYTES),
           (uint64_t)agoq_param_int(AGOQ_PARAM_MIN_BYTES) > AGOQ_NCCL_STAGED_COLLNET_CALL_MAX
               ? " (AGOQ_MIN_BYTES is above NCCL's largest staged call, 2 MiB: in practice every reduction is exact)"
               : "");
}

static void agoq_effect_p2p(agoq_effect* e) {
  if (agoq_typed.format == AGOQ_FORMAT_NONE) {
    snprintf(e->p2p, sizeof e->p2p, "p2p sends: exact (AGOQ_P2P_FORMAT=none, %s)",
             agoq_effect_source(AGOQ_PARAM_P2P_FORMAT));
    return;
  }
  if (agoq_typed.pipeline_only)
    snprintf(e->p2p, sizeof e->p2p,
             "p2p sends: %s (block %s; AGOQ_P2P_FORMAT, %s) for fp32/bf16/fp16 sends of at least %s per transfer "
             "in two-way flows (AGOQ_P2P_SCOPE=pipeline: the communicator already carried a receive of the same type "
             "and size from that peer, as pipeline stages do; equal-split all_to_all too); one-way sends exact "
             "(docs/usage.md)",
             agoq_format_name((agoq_format)agoq_typed.format), agoq_param_str(AGOQ_PARAM_BLOCK),
             agoq_effect_source(AGOQ_PARAM_P2P_FORMAT), agoq_param_str(AGOQ_PARAM_MIN_BYTES));
  else
    snprintf(e->p2p, sizeof e->p2p,
             "p2p sends: %s (block %s; AGOQ_P2P_FORMAT, %s) for every fp32/bf16/fp16 send of at least %s per "
             "transfer whose type agoq's profiler knows (AGOQ_P2P_SCOPE=all): torch.distributed send, recv, isend, "
             "irecv, batch_isend_irecv, scatter, gather and all_to_all(_single) between nodes (docs/usage.md)",
             agoq_format_name((agoq_format)agoq_typed.format), agoq_param_str(AGOQ_PARAM_BLOCK),
             agoq_effect_source(AGOQ_PARAM_P2P_FORMAT), agoq_param_str(AGOQ_PARAM_MIN_BYTES));
}

void agoq_net_effect_describe(agoq_effect* e) {
  memset(e, 0, sizeof *e);
  agoq_effect_transport(e);
  const char* gpu = agoq_gpu_describe();
  snprintf(e->gpu, sizeof e->gpu, "GPU data path: %s%s", gpu,
           agoq_gpu_active() ? "" : "; NCCL's buffers stay in host memory (NCCL's kernels stage them)");
  agoq_effect_collnet(e);
  agoq_effect_p2p(e);
  agoq_effect_hardware(e, agoq_net_tp != NULL && strcmp(agoq_net_tp->name, "tcp") != 0, agoq_gpu_active());
}

static void agoq_net_effect_log(void) {
  agoq_effect e;
  agoq_net_effect_describe(&e);
  AGOQ_INFO(NCCL_INIT | NCCL_NET, AGOQ_EFFECT_TAG "%s", e.transport);
  AGOQ_INFO(NCCL_INIT | NCCL_NET, AGOQ_EFFECT_TAG "%s", e.gpu);
  AGOQ_INFO(NCCL_INIT | NCCL_NET, AGOQ_EFFECT_TAG "%s", e.collnet);
  AGOQ_INFO(NCCL_INIT | NCCL_NET, AGOQ_EFFECT_TAG "%s", e.p2p);
  if (e.unvalidated)
    AGOQ_WARN(AGOQ_EFFECT_TAG "%s", e.hardware);
  else
    AGOQ_INFO(NCCL_INIT | NCCL_NET, AGOQ_EFFECT_TAG "%s", e.hardware);
}

static ncclResult_t agoq_net_config_run(void) {
  AGOQ_CHECK(agoq_params_load());
  const agoq_transport* tp = NULL;
  AGOQ_CHECK(agoq_transport_choose(&tp));
  AGOQ_CHECK(agoq_gpu_init());
  agoq_net_tp = tp;
  agoq_typed_policy_load();
  agoq_net_effect_log();
  return ncclSuccess;
}

ncclResult_t agoq_net_config_load(void) {
  pthread_mutex_lock(&agoq_net_config.mu);
  /* A success stands for the process (the transport's threads and devices are live); a
   * failure stands until the parameters are read again (tests that change them). */
  if (!agoq_net_config.done ||
      (agoq_net_config.res != ncclSuccess && agoq_net_config.params_gen != agoq_params_generation())) {
    agoq_net_config.params_gen = agoq_params_generation();
    agoq_net_config.res = agoq_net_config_run();
    agoq_net_config.done = true;
  }
  ncclResult_t res = agoq_net_config.res;
  pthread_mutex_unlock(&agoq_net_config.mu);
  return res;
}

bool agoq_net_configured(void) {
  pthread_mutex_lock(&agoq_net_config.mu);
  bool ok = agoq_net_config.done && agoq_net_config.res == ncclSuccess;
  pthread_mutex_unlock(&agoq_net_config.mu);
  return ok;
}
