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

/* The identity of a non-local address; a miss is the world. */
static __always_inline __u32 ipcache_identity4(__be32 addr)
{
	struct ipcache_key key = {};
	struct ipcache_value *v;

	key.prefixlen = 32 + 32;
	key.family = CEL_FAMILY_IPV4;
	__builtin_memcpy(key.addr, &addr, 4);
	v = bpf_map_lookup_elem(&cel_ipcache, &key);
	return v ? v->identity : CEL_IDENTITY_WORLD;
}

static __always_inline __u32 ipcache_identity6(const __u8 *addr)
{
	struct ipcache_key key = {};
	struct ipcache_value *v;

	key.prefixlen = 32 + 128;
	key.family = CEL_FAMILY_IPV6;
	__builtin_memcpy(key.addr, addr, 16);
	v = bpf_map_lookup_elem(&cel_ipcache, &key);
	return v ? v->identity : CEL_IDENTITY_WORLD;
}

/* Local endpoints are authoritative for their own addresses. */
static __always_inline __u32 identity_of4(__be32 addr)
{
	struct endpoint_info *ep = endpoint_lookup4(addr);

	return ep ? ep->identity : ipcache_identity4(addr);
}

static __always_inline __u32 identity_of6(const __u8 *addr)
{
	struct endpoint_info *ep = endpoint_lookup6(addr);

	return ep ? ep->identity : ipcache_identity6(addr);
}

static __always_inline struct datapath_config *config_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cel_config, &zero);
}

#endif /* CELLIUM_LIB_LOOKUP_H */
