/* Libraries that export NCCL's plugin symbol names for things that are not plugin tables:
 * agoq-info --lib and agoq-perf --lib must refuse them with an error, never call through
 * them. -DFAKE_SMALL: ncclNetPlugin_v11 is an 8-byte string. Otherwise ncclNetPlugin_v12 is a
 * table-sized object whose name is set but whose members point at no code. */
#include <stdint.h>

#ifdef FAKE_SMALL
__attribute__((visibility("default"))) const char ncclNetPlugin_v11[8] = "garbage";
#else
static const char fake_name[] = "FAKE";
__attribute__((visibility("default"))) const void* ncclNetPlugin_v12[32] = {
    fake_name,          (const void*)0x1000, (const void*)0x2000, (const void*)0x3000,
    (const void*)0x4000, (const void*)0x5000, (const void*)0x6000, (const void*)0x7000};
#endif
