/* agoq-info -c: the verbs ports as the plugin's discovery sees them (the library, every
 * port's fate and why, the GID chosen and why), through the plugin's own code
 * (plugin/transport/ib/agoq_ib.h), never recomputed here. */
#include <stdio.h>
#include <stdlib.h>

#include "agoq_info.h"
#include "core/agoq_params.h"
#include "transport/ib/agoq_ib.h"

static void agoq_info_ib_line(void* arg, const char* line) {
  FILE* out = arg;
  fprintf(out, "  %s\n", line);
}

int agoq_info_config_ports(FILE* out) {
  const char* mode = agoq_param_str(AGOQ_PARAM_TRANSPORT);
  fprintf(out, "\nverbs ports, as the plugin's init discovers them (AGOQ_TRANSPORT=%s [%s], AGOQ_IB_LIBRARY=%s):\n",
          mode, agoq_param_source(AGOQ_PARAM_TRANSPORT), agoq_param_str(AGOQ_PARAM_IB_LIBRARY));
  if (agoq_param_int(AGOQ_PARAM_TRANSPORT) == 1) {
    fprintf(out, "  not looked for (AGOQ_TRANSPORT=tcp)\n");
    return 0;
  }
  agoq_ib_state* st = calloc(1, sizeof *st);
  if (st == NULL) return 1;
  char why[768];
  ncclResult_t res = agoq_ib_discover(st, agoq_info_ib_line, out, why, sizeof why);
  int rc = 0;
  if (res == ncclSuccess) {
    int gdr = 0;
    for (int i = 0; i < st->ndevs; i++) gdr += st->devs[i].dmabuf;
    fprintf(out, "  => the verbs transport carries the traffic (%d port%s); GPU buffers: %s\n", st->ndevs,
            st->ndevs == 1 ? "" : "s",
            gdr == st->ndevs ? "GPUDirect RDMA by DMA-BUF where NCCL registers them so (a GPU with dma-buf support; "
                               "NCCL_DMABUF_ENABLE), else staged through host memory"
            : gdr > 0        ? "GPUDirect RDMA by DMA-BUF on the ports that support it, staged through host memory "
                               "on the others"
                             : "staged through host memory (no port registers dma-bufs)");
  } else if (agoq_param_int(AGOQ_PARAM_TRANSPORT) == 2 || res == ncclInvalidArgument) {
    fprintf(out, "  => %s: NCCL would fail to initialise the plugin\n", why);
    rc = 1;
  } else {
    fprintf(out, "  => verbs off (%s): TCP carries the traffic\n", why);
  }
  agoq_ib_release(st);
  free(st);
  return rc;
}
