/*
 * The node as the plugin needs to see it: GPUs, NICs, NUMA nodes and the PCI bridges in
 * between, the path type between every GPU and NIC (NCCL's vocabulary), the NIC and the
 * cores that serve each GPU. Knows nothing of NCCL: it only reproduces how NCCL's
 * topology code classifies paths so the pciPath we report leads NCCL to the same answer.
 *
 * Sources, best first: hwloc 2.x loaded at run time with dlopen (the plugin never gets a
 * NEEDED libhwloc), then a plain sysfs scan. Everything is plain data once discovered, so
 * the path rules and the NIC choice are tested without hwloc.
 */
#ifndef AGOQ_TOPO_H
#define AGOQ_TOPO_H

#include <limits.h>
#include <net/if.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "agoq_netif.h"

#define AGOQ_TOPO_MAX_GPUS 64
#define AGOQ_TOPO_MAX_NICS 64
#define AGOQ_TOPO_MAX_NUMA 64
#define AGOQ_TOPO_MAX_DEPTH 16 /* PCI bridges between a host bridge and a device */
#define AGOQ_TOPO_BUSID_LEN 13 /* "dddd:bb:dd.f" + NUL */
#define AGOQ_TOPO_NAME_LEN 64
#define AGOQ_TOPO_CPUS_LEN 256 /* cpulist text: "0-55,112-167" */
#define AGOQ_TOPO_NVLINK_MAX 18 /* NVML_NVLINK_MAX_LINKS since Hopper: the links asked per GPU */
#define AGOQ_TOPO_WHY_LEN 256   /* a reason text ("NVML not loaded: <dlerror>") */

/* Return codes (negative): the caller decides how to log them. */
enum {
  AGOQ_TOPO_OK = 0,
  AGOQ_TOPO_ENOHWLOC = -1,  /* hwloc not compiled in, not installed, or wrong major */
  AGOQ_TOPO_ENOENT = -2,    /* XML file missing or unreadable */
  AGOQ_TOPO_EINVAL = -3,    /* XML file hwloc rejects, or a bad argument */
  AGOQ_TOPO_ELOAD = -4,     /* hwloc failed to build the topology */
  AGOQ_TOPO_ENOMEM = -5,
  AGOQ_TOPO_ENOSYSFS = -6,  /* a sysfs root with neither class/net nor bus/pci below it */
};
const char* agoq_topo_strerror(int rc);

/* Path types, best first. Numbering is ours; names are NCCL's. */
typedef enum {
  AGOQ_TOPO_PATH_LOC = 0, /* same device */
  AGOQ_TOPO_PATH_NVL,     /* NVLink/C2C: GPU-GPU from NVML's facts, GPU-NIC when the nvl hook says so */
  AGOQ_TOPO_PATH_PIX,     /* one PCIe switch between */
  AGOQ_TOPO_PATH_PXB,     /* several PCIe switches, no host bridge */
  AGOQ_TOPO_PATH_PXN,     /* GPU to NIC through a peer GPU over NVLink, then PIX/PXB (NCCL's PXN) */
  AGOQ_TOPO_PATH_PHB,     /* through the host bridge of one CPU (NUMA node) */
  AGOQ_TOPO_PATH_SYS,     /* across CPUs (NUMA nodes / sockets) */
} agoq_topo_path_type;
const char* agoq_topo_path_name(agoq_topo_path_type t);

/* Where a PCI device sits: its bus id, the PCI-to-PCI bridges from the root port down to
 * its parent, the root bus, and the NUMA node it is local to. */
typedef struct {
  char busid[AGOQ_TOPO_BUSID_LEN];
  unsigned domain, root_bus;                    /* Linux's pci<domain>:<root_bus> */
  int nbridges;
  char bridges[AGOQ_TOPO_MAX_DEPTH][AGOQ_TOPO_BUSID_LEN]; /* [0] = root port */
  int numa;                                     /* NUMA node os index, -1 unknown */
} agoq_topo_pci;

/* What sits at the far end of a GPU's NVLink (NVML's nvmlIntNvLinkDeviceType_t). */
typedef enum {
  AGOQ_TOPO_NVL_GPU = 0,
  AGOQ_TOPO_NVL_CPU,     /* a CPU's NVLink port (IBM POWER "NPU") */
  AGOQ_TOPO_NVL_SWITCH,  /* an NVSwitch */
  AGOQ_TOPO_NVL_UNKNOWN, /* NVML says it does not know */
} agoq_topo_nvl_remote;
const char* agoq_topo_nvl_remote_name(agoq_topo_nvl_remote r);

/* One active NVLink of a GPU. */
typedef struct {
  int link;                        /* NVML's link index, 0..AGOQ_TOPO_NVLINK_MAX-1 */
  agoq_topo_nvl_remote remote;
  char busid[AGOQ_TOPO_BUSID_LEN]; /* the far end's PCI bus id, "" when NVML gives none */
  int gpu;                         /* index into gpus[] when the far end is one of them, else -1 */
} agoq_topo_nvlink;

typedef struct {
  agoq_topo_pci pci;
  uint16_t vendor, device, class_id;
  int cuda; /* CUDA device ordinal when the driver matched its bus id, else -1 */
  /* NVLink facts from NVML (agoq_topo_nvml_annotate); all zero/false until then. */
  bool nvml;                       /* NVML knows this GPU (matched by bus id) */
  int nvlinks;                     /* active NVLinks: the used entries of nvlink[] */
  bool nvswitch;                   /* at least one active link ends at an NVSwitch */
  agoq_topo_nvlink nvlink[AGOQ_TOPO_NVLINK_MAX];
} agoq_topo_gpu;

typedef enum { AGOQ_TOPO_NIC_NET = 0, AGOQ_TOPO_NIC_IB = 1 } agoq_topo_nic_kind;

typedef struct {
  char name[AGOQ_TOPO_NAME_LEN];   /* "mlx5_0", "mlx4_0:2" (multi-port), "eth0" */
  char ibdev[AGOQ_TOPO_NAME_LEN];  /* InfiniBand/RoCE device ("mlx4_0"), "" for IP-only NICs */
  char netdev[IF_NAMESIZE + 1];    /* IP interface of this NIC, "" if none (IB only) */
  agoq_topo_nic_kind kind;
  bool has_pci;
  agoq_topo_pci pci;
  char pci_path[PATH_MAX];         /* /sys/devices/... of the PCI device; "" if none */
  int port;                        /* 1-based; 0 unknown */
  uint64_t guid;                   /* node GUID for IB; 0 unknown */
  int speed_mbps;                  /* -1 unknown */
} agoq_topo_nic;

typedef struct {
  int os_index;
  cpu_set_t cpus;
  uint64_t memory_bytes;
} agoq_topo_numa;

/* Whether NVML was asked for NVLink facts. Zero (NOT_ASKED) is the state of a freshly
 * discovered or loaded topology, so everything NVLink-related stays out of its output. */
typedef enum {
  AGOQ_TOPO_NVML_NOT_ASKED = 0,
  AGOQ_TOPO_NVML_LOADED,      /* NVML answered; per-GPU facts are in gpus[] */
  AGOQ_TOPO_NVML_UNAVAILABLE, /* asked, but no usable NVML: nvml_why says why */
} agoq_topo_nvml_state;

typedef struct {
  int ngpus, nnics, nnuma;
  agoq_topo_gpu gpus[AGOQ_TOPO_MAX_GPUS];
  agoq_topo_nic nics[AGOQ_TOPO_MAX_NICS];
  agoq_topo_numa numa[AGOQ_TOPO_MAX_NUMA];
  bool this_system;     /* discovered on this machine (sysfs paths are real) */
  char source[32];      /* "hwloc", "hwloc-xml", "sysfs" */
  agoq_topo_nvml_state nvml_state;
  char nvml_why[AGOQ_TOPO_WHY_LEN]; /* UNAVAILABLE: "NVML not loaded: <dlerror>", ... */
} agoq_topo;

/* ---- Discovery ------------------------------------------------------------------------ */

/* True when hwloc could be loaded (cached after the first call). `why` (may be NULL)
 * receives the reason when it could not. */
bool agoq_topo_hwloc_available(char* why, size_t len);

/* This machine through hwloc. AGOQ_TOPO_ENOHWLOC when hwloc is not usable. */
int agoq_topo_discover_hwloc(agoq_topo* t);
/* An hwloc XML file. Never falls back to this machine: a missing file is
 * AGOQ_TOPO_ENOENT, one hwloc refuses AGOQ_TOPO_EINVAL. */
int agoq_topo_load_xml(const char* path, agoq_topo* t);
/* An hwloc XML document in memory (fuzzing, embedded tests). */
int agoq_topo_load_xml_buffer(const char* buf, int len, agoq_topo* t);
/* This machine from sysfs alone, below `sysfs_root` ("/sys" except in tests).
 * AGOQ_TOPO_ENOSYSFS when the root has neither class/net nor bus/pci (a mistyped or
 * missing directory would otherwise read as a machine without devices). */
int agoq_topo_discover_sysfs(const char* sysfs_root, agoq_topo* t);
/* hwloc, else sysfs. *used_fallback tells which. */
int agoq_topo_discover(agoq_topo* t, bool* used_fallback);

/* ---- Paths ---------------------------------------------------------------------------- */

/* Asked for every GPU-NIC pair before the PCI rules: true = NVLink/C2C path. NULL (the
 * default) = never. agoq_topo_nvml_nvl_hook answers it from NVML's facts. */
typedef bool (*agoq_topo_nvl_hook)(void* arg, const char* gpu_busid, const char* nic_busid);
void agoq_topo_set_nvl_hook(agoq_topo_nvl_hook hook, void* arg);

/* NCCL's classification of the path between two PCI devices; *hops (may be NULL)
 * receives the number of links in NCCL's model of the tree. */
agoq_topo_path_type agoq_topo_pci_path(const agoq_topo_pci* a, const agoq_topo_pci* b, int* hops);
/* GPU g to NIC n; a NIC without a PCI device is attached to the first CPU as NCCL does.
 * With NVLink facts, PXN where NCCL would relay through a peer GPU (agoq_topo_gpu_nic_route). */
agoq_topo_path_type agoq_topo_gpu_nic_path(const agoq_topo* t, int g, int n, int* hops);
/* Without PXN: the nvl hook, then the PCI rules (what nvidia-smi would call the path). */
agoq_topo_path_type agoq_topo_gpu_nic_direct(const agoq_topo* t, int g, int n, int* hops);
/* With PXN, and *via (may be NULL) receives the peer GPU of a PXN path (-1 = direct).
 * PXN, as NCCL's paths.cc decides it: GPU g's own path to NIC n goes through a CPU (PHB or
 * SYS), the NIC's local GPU p (agoq_topo_nic_local_gpu) reaches it by PIX/PXB (or NVL), and
 * g and p share NVLink (directly or through NVSwitches). Without NVLink facts: never. */
agoq_topo_path_type agoq_topo_gpu_nic_route(const agoq_topo* t, int g, int n, int* hops, int* via);
/* The GPU NCCL relays NIC n's traffic through: of the GPUs nearest to it by PCI (type, then
 * hops), the k-th for the k-th NIC sharing that set of nearest GPUs (so two NICs under one
 * switch get its two GPUs). -1 without GPUs. */
int agoq_topo_nic_local_gpu(const agoq_topo* t, int n);
/* NVLinks joining GPUs a and b (nvidia-smi's NV#): their direct links, plus, when both reach
 * NVSwitches, the smaller of their two switch-link counts. 0 without NVLink facts. */
int agoq_topo_gpu_nvlinks(const agoq_topo* t, int a, int b);
/* GPU a to GPU b: LOC for a == b, NVL when agoq_topo_gpu_nvlinks > 0 (1 hop direct, 2
 * through an NVSwitch), else the PCI rules. */
agoq_topo_path_type agoq_topo_gpu_gpu_path(const agoq_topo* t, int a, int b, int* hops);

/* ---- NIC and core choice ---------------------------------------------------------------- */

typedef struct {
  int nic[AGOQ_TOPO_MAX_GPUS];                    /* index into nics, -1 = none */
  agoq_topo_path_type path[AGOQ_TOPO_MAX_GPUS];   /* of the chosen NIC */
  int via[AGOQ_TOPO_MAX_GPUS];                    /* PXN: the peer GPU relaying, -1 = direct */
  bool rail_aligned;                              /* 1:1 pairing per PCIe switch */
} agoq_topo_choice;

/* Rail-aligned 1:1 when every group of GPUs and NICs joined by PIX/PXB paths holds as
 * many NICs as GPUs; else the nearest NIC: best path type, then fewest hops, then lowest
 * index. Path types are agoq_topo_gpu_nic_route's, so with NVLink facts a PXN NIC (through
 * a peer GPU) beats one behind the CPU (PHB/SYS), as it does in NCCL. */
void agoq_topo_choose(const agoq_topo* t, agoq_topo_choice* out);

/* Index into t->numa of NUMA node `os_index`, or -1. */
int agoq_topo_numa_find(const agoq_topo* t, int os_index);

/* CPUs to run on for work local to NUMA node `os_index`: the node's CPUs intersected with
 * `allowed` (the process's sched_getaffinity set). False (out cleared) when the node is
 * unknown or the intersection is empty: then do not pin. */
bool agoq_topo_placement_cpus(const agoq_topo* t, int os_index, const cpu_set_t* allowed, cpu_set_t* out);

/* The TCP transport's interfaces (agoq_netif.h) completed from the topology: NUMA node and
 * its CPUs, the PCI device's sysfs path as pciPath, and the link speed when sysfs had none.
 * Interfaces the topology does not know (lo, virtual ones) are left as they are. Returns
 * how many were matched. */
int agoq_topo_annotate_netifs(const agoq_topo* t, agoq_netif* ifs, int n);

/* ---- CUDA (agoq_topo_cuda.c) ------------------------------------------------------------ */

/* Same PCI device? CUDA writes an 8-digit domain ("00000000:19:00.0"), sysfs 4 digits. */
bool agoq_topo_busid_equal(const char* a, const char* b);
/* Sets gpus[].cuda from the CUDA ordinals' bus ids (busids[d] is device d's); returns how
 * many matched. */
int agoq_topo_match_cuda(agoq_topo* t, const char* const* busids, int n);
/* On this machine with a CUDA driver (dlopened libcuda.so.1): asks it for every device's
 * bus id and matches. No driver, no device, or an XML topology: ordinals stay -1. */
int agoq_topo_cuda_annotate(agoq_topo* t);

/* ---- NVLink through NVML (agoq_topo_nvml.c) ------------------------------------------- */

/* Asks NVML (dlopened from lib_path; NULL = "libnvidia-ml.so.1") for every GPU's active
 * NVLinks and what is at their far ends, and records them in the GPUs it matches by PCI bus
 * id. Returns how many GPUs matched. Facts from an earlier call are cleared first; without a
 * usable NVML that is all that happens besides nvml_state (UNAVAILABLE) and nvml_why.
 * Whether the topology is this machine's is the caller's business: an XML topology may be
 * annotated from a fake NVML (tests), but annotating one from this machine's NVML mixes two
 * machines. */
int agoq_topo_nvml_annotate(agoq_topo* t, const char* lib_path);
/* An agoq_topo_nvl_hook (arg: the annotated const agoq_topo*): true when one of the GPU's
 * active NVLinks ends at the NIC's PCI function. Install with
 * agoq_topo_set_nvl_hook(agoq_topo_nvml_nvl_hook, t) for as long as t lives. */
bool agoq_topo_nvml_nvl_hook(void* topo, const char* gpu_busid, const char* nic_busid);

/* ---- Output ----------------------------------------------------------------------------- */

/* "0-55,112-167"; "" for an empty set. */
const char* agoq_topo_cpulist(const cpu_set_t* set, char* buf, size_t len);
/* Parses a kernel cpulist ("0-3,8,10-11"); -1 on syntax errors. */
int agoq_topo_cpulist_parse(const char* text, cpu_set_t* set);
/* Linux's sysfs path of a PCI device from its bridge chain:
 * /sys/devices/pci0000:00/0000:00:01.0/.../<busid>. */
void agoq_topo_pci_sysfs_path(const agoq_topo_pci* p, char* buf, size_t len);

/* nvidia-smi topo -m's words for a matrix cell: "X" (itself), "NV<links>", "PIX", "PXB",
 * "PHB" (one PCIe host bridge), "NODE" (host bridges of one NUMA node), "SYS". The PCI
 * classes are NCCL's (agoq_topo_pci_path); a GPU-NIC cell is the direct path, never PXN. */
const char* agoq_topo_smi_gpu_gpu(const agoq_topo* t, int a, int b, char* buf, size_t len);
const char* agoq_topo_smi_gpu_nic(const agoq_topo* t, int g, int n, char* buf, size_t len);

/* Both print the NVLink state and the nvidia-smi style matrix only when NVML was asked
 * (nvml_state != NOT_ASKED), so output for XML files stays independent of the machine. */
void agoq_topo_print_text(FILE* out, const agoq_topo* t, const agoq_topo_choice* c);
void agoq_topo_print_json(FILE* out, const agoq_topo* t, const agoq_topo_choice* c);

#endif
