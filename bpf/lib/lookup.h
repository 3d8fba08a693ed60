/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Endpoint and ipcache lookups by IPv4 or IPv6 address.
 */
#ifndef CELLIUM_LIB_LOOKUP_H
#define CELLIUM_LIB_LOOKUP_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"

static __always_inline struct endpoint_info *endpoint_lookup4(__be32 addr)
{
	struct endpoint_key key = {};

	__builtin_memcpy(key.addr, &addr, 4);
	key.family = CEL_FAMILY_IPV4;
	return bpf_map_lookup_elem(&cel_endpoints, &key);
}

static __always_inline struct endpoint_info *endpoint_lookup6(const __u8 *addr)
{
	struct endpoint_key key = {};

	__builtin_memcpy(key.addr, addr, 16);
	key.family = CEL_FAMILY_IPV6;
	return bpf_map_lookup_elem(&cel_endpoints, &key);
}

/* The identity of an address outside the ipcache: the world, split by
 * family on a node with pods of both (CEL_CFG_F_WORLD_PER_FAMILY). */
static __always_inline __u32 world_identity(const struct datapath_config *cfg, __u8 family)
{
	if (cfg && (cfg->flags & CEL_CFG_F_WORLD_PER_FAMILY))
		return family == CEL_FAMILY_IPV6 ? CEL_IDENTITY_WORLD_IPV6 : CEL_IDENTITY_WORLD_IPV4;
	return CEL_IDENTITY_WORLD;
}

/* The identity of a non-local address; a miss is the world. */
static __always_inline __u32 ipcache_identity4(const struct datapath_config *cfg, __be32 addr)
{
	struct ipcache_key key = {};
	struct ipcache_value *v;

	key.prefixlen = 32 + 32;
	key.family = CEL_FAMILY_IPV4;
	__builtin_memcpy(key.addr, &addr, 4);
	v = bpf_map_lookup_elem(&cel_ipcache, &key);
	return v ? v->identity : world_identity(cfg, CEL_FAMILY_IPV4);
}

static __always_inline __u32 ipcache_identity6(const struct datapath_config *cfg,
					       const __u8 *addr)
{
	struct ipcache_key key = {};
	struct ipcache_value *v;

	key.prefixlen = 32 + 128;
	key.family = CEL_FAMILY_IPV6;
	__builtin_memcpy(key.addr, addr, 16);
	v = bpf_map_lookup_elem(&cel_ipcache, &key);
	return v ? v->identity : world_identity(cfg, CEL_FAMILY_IPV6);
}

/* Local endpoints are authoritative for their own addresses. */
static __always_inline __u32 identity_of4(const struct datapath_config *cfg, __be32 addr)
{
	struct endpoint_info *ep = endpoint_lookup4(addr);

	return ep ? ep->identity : ipcache_identity4(cfg, addr);
}

static __always_inline __u32 identity_of6(const struct datapath_config *cfg, const __u8 *addr)
{
	struct endpoint_info *ep = endpoint_lookup6(addr);

	return ep ? ep->identity : ipcache_identity6(cfg, addr);
}

/*
 * The identity of a source address off one of the node's devices. Nothing
 * that arrives from the network is the node itself: a packet with one of the
 * node's own addresses as its source was forged (or is the node's own, looped
 * back), and taken as host it would pass every pod's allow-localhost. It is
 * the world, as in Cilium, whose bpf_host ignores a HOST_ID the ipcache gives
 * a packet from the network. The node's own packets reach its pods through
 * its stack (cel_to_container), which keeps host.
 */
static __always_inline __u32 netdev_identity4(const struct datapath_config *cfg, __be32 addr)
{
	__u32 id = identity_of4(cfg, addr);

	return id == CEL_IDENTITY_HOST ? world_identity(cfg, CEL_FAMILY_IPV4) : id;
}

static __always_inline __u32 netdev_identity6(const struct datapath_config *cfg,
					      const __u8 *addr)
{
	__u32 id = identity_of6(cfg, addr);

	return id == CEL_IDENTITY_HOST ? world_identity(cfg, CEL_FAMILY_IPV6) : id;
}

static __always_inline struct datapath_config *config_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cel_config, &zero);
}

#endif /* CELLIUM_LIB_LOOKUP_H */
