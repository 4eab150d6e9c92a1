/*
 * agoq-info: what a user needs to check an installation before NCCL loads it: version,
 * features, devices as NCCL will see them, and every AGOQ_* parameter.
 */
#ifndef AGOQ_INFO_H
#define AGOQ_INFO_H

#include <stdbool.h>
#include <stdio.h>

/* `agoq-info -c`: every parameter with its value in effect and where it came from.
 * Returns 0, or 1 when a value in the environment is invalid (the table is still printed). */
int agoq_info_config_text(FILE* out);

/* `agoq-info -c --markdown`: docs/configuration.md. Depends only on the table, never on the
 * environment, so the committed file can be checked against the build. */
void agoq_info_config_markdown(FILE* out);

/* Default view: loads the plugin at lib_path (NULL: next to this executable) and drives it
 * as NCCL would. Returns 0 or 1. */
int agoq_info_devices(FILE* out, const char* lib_path, bool json);

/* ---- what the plugin's init resolves (info_net.c, through the plugin's own code) ---- */

#include "transport/tcp/agoq_tcp.h"

typedef struct {
  agoq_transport_config config; /* interfaces, data sockets per connection */
  int nthreads;                 /* progress threads */
  bool nthreads_auto, nsocks_auto;
} agoq_info_net;

/* 0, or -1 when init would fail; its WARN is logged. */
int agoq_info_net_resolve(agoq_info_net* n);
const agoq_netif* agoq_info_net_find(const agoq_info_net* n, const char* name);
/* An interface's address (no port), link ("up" / "no carrier") and speed source. */
void agoq_info_netif_fields(const agoq_netif* nif, char* addr, size_t addr_len, const char** link,
                            const char** speed_source);
/* Device dev's socket buffer sizes as the plugin sets them. */
void agoq_info_net_print_buffers(FILE* out, const agoq_info_net* n, int dev);
void agoq_info_net_print_counts(FILE* out, const agoq_info_net* n);
/* `agoq-info -c`'s interface section: 0, or 1 when no interface matches. */
int agoq_info_config_interfaces(FILE* out);
/* `agoq-info -c`'s verbs section: 0, or 1 when AGOQ_TRANSPORT=ib (or an invalid AGOQ_IB_HCA)
 * would fail init. */
int agoq_info_config_ports(FILE* out);

/* Shared formatting helpers. */
/* "64K" when v is a whole number of K/M/G/T, else the decimal bytes. */
void agoq_info_size_human(long long v, char* buf, size_t len);
/* Writes text wrapped at width columns, each line starting with indent spaces. */
void agoq_info_wrap(FILE* out, const char* text, int indent, int width);

#endif
