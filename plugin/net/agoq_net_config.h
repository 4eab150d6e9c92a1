/*
 * The plugin's configuration, once per process: every check init makes (parameters,
 * unknown AGOQ_* names, transport, GPU data path, the typed p2p policy), and what is in
 * effect as five lines. The net init runs it; `agoq-info -c` runs the very same function,
 * so the pre-launch check can never pass what init refuses.
 */
#ifndef AGOQ_NET_CONFIG_H
#define AGOQ_NET_CONFIG_H

#include <stdbool.h>

#include "abi/agoq_nccl_common.h"

/* The lines start with these labels; agoq-info finds the block in the plugin's log by
 * AGOQ_EFFECT_TAG. */
#define AGOQ_EFFECT_TAG "in effect: "

typedef struct {
  char transport[384];  /* "transport: tcp on lo (verbs off: ...)" */
  char gpu[448];        /* "GPU data path: off: no CUDA driver (...)" */
  char collnet[384];    /* "CollNet reductions: ..." */
  char p2p[512];        /* "p2p sends: exact (...)" */
  char hardware[448];   /* "not yet run on hardware: ...", "known to hang on hardware: ..." or "every path in use has run ..." */
  bool unvalidated;     /* hardware names a path in use that has never run on real hardware */
} agoq_effect;

/* Loads and checks the configuration once per process (later calls return the first
 * outcome, so each WARN is printed once however many inits NCCL makes), then logs the
 * summary at INFO and, while a path in use is unvalidated, one WARN. Fails as init must:
 * an invalid value, no usable interface, a transport or GPU mode that cannot start. */
ncclResult_t agoq_net_config_load(void);

/* True after a successful agoq_net_config_load. */
bool agoq_net_configured(void);

/* The summary of what a successful load put in effect (after a failed one, what is known). */
void agoq_net_effect_describe(agoq_effect* e);

#endif
