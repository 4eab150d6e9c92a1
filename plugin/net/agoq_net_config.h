/*
 * What the plugin's init resolves from the environment, exposed so agoq-info shows the
 * values the plugin uses (its own code, never a second copy of the rules): the interfaces
 * AGOQ_SOCKET_IFNAME selects (address, carrier, speed and whether it was measured), data
 * sockets per connection and progress threads with their 0 = auto resolved.
 */
#ifndef AGOQ_NET_CONFIG_H
#define AGOQ_NET_CONFIG_H

#include "net/agoq_comm.h"

/* Loads the parameters and fills c as init does (interface discovery, topology, socket
 * options). A filter that matches nothing is ncclSystemError, logged with the interfaces
 * that exist; an invalid parameter value is ncclInvalidUsage. Starts nothing. */
ncclResult_t agoq_net_config_resolve(agoq_transport_config* c);

/* Progress threads the plugin runs (AGOQ_SOCKET_NTHREADS, 0 resolved); after the
 * parameters are loaded. */
int agoq_net_config_nthreads(void);

#endif
