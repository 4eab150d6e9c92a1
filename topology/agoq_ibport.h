/*
 * The hardware-facing pure logic of the InfiniBand/RoCE (verbs) transport: link speed
 * and MTU from libibverbs' codes, the NCCL_IB_HCA filter, the choice of a RoCE/IB GID
 * and two sysfs reads (GID type, PCI path). Knows nothing of NCCL and nothing of
 * libibverbs' structs: the transport copies what ibv_query_port/ibv_query_gid returned
 * into the plain structs below, so every rule here is tested on a machine without an HCA.
 * Nothing logs: where a decision needs explaining, a reason string comes back for the
 * caller to log (the GID and HCA choices are the usual cause of "status=12" timeouts and
 * of the wrong NIC being used, so the reasons name the entries and the rule that won).
 */
#ifndef AGOQ_IBPORT_H
#define AGOQ_IBPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Port attributes --------------------------------------------------------------- */

/* The values of libibverbs' enum ibv_link_layer, so a port_attr.link_layer copies over. */
typedef enum {
  AGOQ_IB_LINK_LAYER_UNSPECIFIED = 0,
  AGOQ_IB_LINK_LAYER_INFINIBAND = 1,
  AGOQ_IB_LINK_LAYER_ETHERNET = 2,
} agoq_ib_link_layer;

/* libibverbs' enum ibv_port_state value of a port that can carry traffic. */
#define AGOQ_IB_PORT_STATE_ACTIVE 4

/* A GID's type as the kernel reports it (sysfs gid_attrs/types or ibv_query_gid_ex).
 * UNKNOWN: the type could not be read (agoq_ib_gid_entry.type_errno says why). */
typedef enum {
  AGOQ_IB_GID_TYPE_UNKNOWN = 0,
  AGOQ_IB_GID_TYPE_IB,
  AGOQ_IB_GID_TYPE_ROCE_V1,
  AGOQ_IB_GID_TYPE_ROCE_V2,
} agoq_ib_gid_type;

typedef struct {
  uint8_t raw[16];       /* network byte order, as union ibv_gid.raw */
  agoq_ib_gid_type type;
  int type_errno;        /* with type UNKNOWN: the errno of the failed read (EINVAL in
                          * containers); 0 when the type was read or never asked */
} agoq_ib_gid_entry;

typedef struct {
  char dev[64];                 /* ibv_get_device_name, e.g. "mlx5_0" */
  int port;                     /* 1-based */
  int state;                    /* libibverbs enum ibv_port_state: 4 = ACTIVE */
  int link_layer;               /* agoq_ib_link_layer */
  int active_mtu;               /* enum ibv_mtu 1..5 */
  int active_width;             /* libibverbs width code (1, 2, 4, 8, 16) */
  int active_speed;             /* libibverbs speed code; 0 if only active_speed_ex is set */
  uint32_t active_speed_ex;     /* rdma-core >= 47; 0 when unknown */
  uint16_t lid;
  uint64_t sys_image_guid;
  int gid_count;                /* entries in gids (the port's gid_tbl_len or fewer) */
  const agoq_ib_gid_entry* gids;
} agoq_ib_port_info;

/* Link rate in Mbit/s: the per-lane rate of the speed code (active_speed_ex when it is
 * non-zero, else active_speed; SDR 2500 ... NDR 100000, XDR 200000) times the lanes of
 * the width code (1 -> 1x, 2 -> 4x, 4 -> 8x, 8 -> 12x, 16 -> 2x). 0 when either code is
 * unknown: the caller logs that and uses its default. */
int agoq_ib_speed_mbps(int active_speed, uint32_t active_speed_ex, int active_width);

/* Lanes of a width code (1, 4, 8, 12, 2), 0 if unknown. */
int agoq_ib_width_lanes(int active_width);

/* Bytes of an enum ibv_mtu value (1 -> 256 ... 5 -> 4096), 0 if invalid. */
int agoq_ib_mtu_bytes(int mtu_enum);

/* Names for log lines and agoq-info; never NULL ("unknown" for a code not listed). */
const char* agoq_ib_link_layer_name(int link_layer);    /* "IB", "RoCE", "unspecified" */
const char* agoq_ib_port_state_name(int state);         /* "DOWN", "INIT", "ARMED", "ACTIVE", ... */
const char* agoq_ib_gid_type_name(agoq_ib_gid_type t);  /* "IB", "RoCE v1", "RoCE v2", "unknown" */
const char* agoq_ib_width_name(int active_width);       /* "1x", "4x", "8x", "12x", "2x" */
const char* agoq_ib_speed_name(int active_speed, uint32_t active_speed_ex); /* "SDR" ... "XDR" */

/* NCCL's discovery rule for one port: ACTIVE, and a link layer of InfiniBand or Ethernet.
 * Returns true when the port is usable; otherwise why (e.g. "mlx5_0:1 is DOWN") in why. */
bool agoq_ib_port_usable(const agoq_ib_port_info* port, char* why, size_t why_len);

/* ---- HCA filter (NCCL_IB_HCA syntax) ------------------------------------------------ */

#define AGOQ_IB_HCA_FILTER_MAX 32
#define AGOQ_IB_HCA_NAME_MAX 64 /* bytes with the NUL */

typedef struct {
  char name[AGOQ_IB_HCA_NAME_MAX];
  int port; /* 1.. or -1 = every port */
} agoq_ib_hca_filter_entry;

/* count == 0 is no filter: every device and port passes. */
typedef struct {
  agoq_ib_hca_filter_entry entries[AGOQ_IB_HCA_FILTER_MAX];
  int count;
  bool exclude; /* leading '^': the listed ports are the ones NOT used */
  bool exact;   /* leading '=' (after '^' if both): whole names, not prefixes */
} agoq_ib_hca_filter;

/* Parses "dev[:port],..." with an optional leading "^", "=" or "^=". NULL or "" gives
 * the empty filter. Stricter than NCCL where NCCL silently accepts a list that can never
 * match what the user meant: an empty entry, more than 32 entries, a name longer than 63
 * bytes or with whitespace, '^'/'=' anywhere but at the start, a port that is not an
 * integer 1..255, and anything after the port are errors. Returns 0, or -1 with the
 * reason in err (the caller prefixes the variable's name). */
int agoq_ib_hca_filter_parse(const char* spec, agoq_ib_hca_filter* out, char* err, size_t errlen);

/* NCCL's semantics exactly: a device passes an entry when its name starts with the
 * entry's name (equals it with `exact`) and the entry's port is -1 or `port` (a `port`
 * of -1 asks about the device as a whole); the list's verdict is inverted by `exclude`.
 * Prefix matching is NCCL's documented pitfall ("mlx5_1" also selects "mlx5_11"): kept
 * for compatibility, made visible by agoq_ib_hca_filter_describe. NULL filter: true. */
bool agoq_ib_hca_filter_match(const agoq_ib_hca_filter* f, const char* dev, int port);

/* One line saying why dev:port is used or not, for the caller to log per port: "no
 * filter", "matches 'mlx5_1' by prefix (use '=' for exact names)", "matches 'mlx5_1'
 * exactly", "excluded by '^mlx5_0'", "not excluded by '^mlx5_0'", "not in the list
 * 'mlx5_0,mlx5_2'". Always NUL-terminated (truncated to n). Returns 1 when the port
 * passes the filter, 0 when not: the same verdict as agoq_ib_hca_filter_match. */
int agoq_ib_hca_filter_describe(const agoq_ib_hca_filter* f, const char* dev, int port, char* out, size_t n);

/* ---- GID choice -------------------------------------------------------------------- */

typedef struct {
  int index;        /* -1 = choose automatically; else this index (checked) */
  int family;       /* AF_INET (default), AF_INET6, or AF_UNSPEC = either */
  int roce_version; /* 2 (default) or 1 */
} agoq_ib_gid_policy;

/* The defaults above: { -1, AF_INET, 2 }. */
agoq_ib_gid_policy agoq_ib_gid_policy_default(void);

/* GID properties the choice rests on. "Configured": not all zero and not the bare
 * "fe80::" a port carries before an address is assigned. Link-local: fe80::/10.
 * IPv4-mapped: ::ffff:a.b.c.d (what RoCE uses for an IPv4 address). */
bool agoq_ib_gid_is_configured(const uint8_t raw[16]);
bool agoq_ib_gid_is_link_local(const uint8_t raw[16]);
bool agoq_ib_gid_is_ipv4_mapped(const uint8_t raw[16]);

/* Chooses the GID index for `port` under `policy` (NULL = defaults).
 * InfiniBand: the policy's index when set (it must exist and be configured), else index
 * 0, which must be configured. Ethernet (RoCE): an explicit index must exist and be
 * configured; a link-local one or one whose known type is not the wanted RoCE version is
 * accepted (the user asked) with a warning in the reason. Automatic: among configured,
 * non-link-local entries of the wanted family and RoCE version, a known type beats an
 * unreadable one (assumed to be the wanted version, as NCCL does for EINVAL), then the
 * lowest index wins; with no candidate of the wanted family the other family is used and
 * the reason says so. Returns 0 with *index_out set and the reason naming the index, GID,
 * type, family and why it won; or -1 with the reason listing why each entry was refused. */
int agoq_ib_gid_choose(const agoq_ib_port_info* port, const agoq_ib_gid_policy* policy, int* index_out,
                       char* reason, size_t reason_len);

/* The whole GID table, one line per entry ("  [3] ::ffff:10.0.0.5  RoCE v2  usable
 * (IPv4)"; a run of all-zero entries is one line "[4-255]"), for INFO logs and agoq-info.
 * Returns the length the full text needs (as snprintf), so out may be NULL with n 0. */
int agoq_ib_gid_table_describe(const agoq_ib_port_info* port, char* out, size_t n);

/* Text form of a GID (inet_ntop AF_INET6: "fe80::1", "::ffff:10.0.0.5"), truncated to n. */
void agoq_ib_gid_format(const uint8_t raw[16], char* out, size_t n);

/* ---- sysfs (sysfs_root is "/sys" in production, a fixture tree in tests) ------------ */

/* Reads <root>/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<index>: "RoCE v2" ->
 * ROCE_V2, "IB/RoCE v1" -> ROCE_V1 (the kernel writes that for every v1/IB entry; on an
 * InfiniBand port the caller takes the GID as IB and needs no type). Returns 0, or an
 * errno with *out = UNKNOWN: the read's own errno (EINVAL in containers, which the caller
 * treats as an unknown type), ENOENT for no such entry, ENODATA for an empty file,
 * EPROTO for text it does not know, ENODEV for a device name that is no plain name,
 * ERANGE for a port < 1 or index < 0, ENAMETOOLONG, EFAULT for a NULL argument. */
int agoq_ib_sysfs_gid_type(const char* sysfs_root, const char* dev, int port, int index, agoq_ib_gid_type* out);

/* realpath of <root>/class/infiniband/<dev>/device with the PCI function digit of its
 * last component zeroed ("0000:17:00.1" -> "0000:17:00.0"), so the ports and functions
 * of one NIC share a path as they do in NCCL's topology. A last component that is not a
 * PCI address is left as it is. Returns 0, or an errno (realpath's, ENODEV for a device
 * name that is no plain name, ENAMETOOLONG when out is too small, EFAULT for NULL). */
int agoq_ib_sysfs_pci_path(const char* sysfs_root, const char* dev, char* out, size_t n);

#endif
