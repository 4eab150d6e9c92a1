/*
 * Shared by the exported-table sources only: the export marker, the exported tables,
 * and the per-version property conversions (agoq_net_props.c) the net tables use.
 */
#ifndef AGOQ_TABLES_H
#define AGOQ_TABLES_H

#include "abi/agoq_nccl_net_v12.h"
#include "abi/agoq_nccl_net_v6.h"

/* The library is built with hidden visibility; only the plugin tables are marked. */
#define AGOQ_EXPORT __attribute__((visibility("default")))

/* The symbols NCCL looks up by name; exports.map lets exactly these through. */
AGOQ_EXPORT extern const ncclNet_v6_t ncclNetPlugin_v6;
AGOQ_EXPORT extern const ncclNet_v7_t ncclNetPlugin_v7;
AGOQ_EXPORT extern const ncclNet_v8_t ncclNetPlugin_v8;
AGOQ_EXPORT extern const ncclNet_v9_t ncclNetPlugin_v9;
AGOQ_EXPORT extern const ncclNet_v10_t ncclNetPlugin_v10;
AGOQ_EXPORT extern const ncclNet_v11_t ncclNetPlugin_v11;
AGOQ_EXPORT extern const ncclNet_v12_t ncclNetPlugin_v12;
AGOQ_EXPORT extern const ncclCollNet_v6_t ncclCollNetPlugin_v6;
AGOQ_EXPORT extern const ncclCollNet_v7_t ncclCollNetPlugin_v7;
AGOQ_EXPORT extern const ncclCollNet_v8_t ncclCollNetPlugin_v8;
AGOQ_EXPORT extern const ncclCollNet_v9_t ncclCollNetPlugin_v9;
AGOQ_EXPORT extern const ncclCollNet_v10_t ncclCollNetPlugin_v10;
AGOQ_EXPORT extern const ncclCollNet_v11_t ncclCollNetPlugin_v11;
AGOQ_EXPORT extern const ncclCollNet_v12_t ncclCollNetPlugin_v12;

/* getProperties for each distinct ncclNetProperties layout (v10 shares v9's). */
ncclResult_t agoq_props_get_v6(int dev, ncclNetProperties_v6_t* props);
ncclResult_t agoq_props_get_v7(int dev, ncclNetProperties_v7_t* props);
ncclResult_t agoq_props_get_v8(int dev, ncclNetProperties_v8_t* props);
ncclResult_t agoq_props_get_v9(int dev, ncclNetProperties_v9_t* props);
ncclResult_t agoq_props_get_v11(int dev, ncclNetProperties_v11_t* props);
ncclResult_t agoq_props_get_v12(int dev, ncclNetProperties_v12_t* props);

#endif
