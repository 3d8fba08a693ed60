/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Map definitions. Names are the contract with user space (they become the
 * pin names under <bpf_root>/maps); sizes are what a node of a few hundred
 * pods with heavy traffic needs, and changing one makes the loader recreate
 * that map on the next start.
 */
#ifndef CELLIUM_LIB_MAPS_H
#define CELLIUM_LIB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include <cellium/common.h>
#include <cellium/config.h>
#include <cellium/conntrack.h>
#include <cellium/endpoint.h>
#include <cellium/events.h>
#include <cellium/frag.h>
#include <cellium/ipcache.h>
#include <cellium/lb.h>
#include <cellium/metrics.h>
#include <cellium/policy.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct endpoint_key);
	__type(value, struct endpoint_info);
	__uint(max_entries, 65536);
} cel_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_value);
	__uint(max_entries, 524288);
	/* LPM tries must not be preallocated. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
} cel_ipcache SEC(".maps");

/* Endpoint id -> that endpoint's own policy map, an LPM trie the agent
 * creates with bpf-policy-map-max entries: no endpoint's entries take room
 * from another's. The kernel compares an inner LPM trie's type, key and
 * value size and flags with this template, not its size. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, 65536);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);
		__uint(key_size, sizeof(struct policy_key));
		__uint(value_size, sizeof(struct policy_value));
		__uint(max_entries, 16384);
		__uint(map_flags, BPF_F_NO_PREALLOC);
	});
} cel_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 131072);
} cel_ct4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct6_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 131072);
} cel_ct6 SEC(".maps");

/* Datagrams in flight are few and short-lived: LRU eviction only loses the
 * oldest, whose fragments have long arrived or will be reassembled nowhere. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag4_key);
	__type(value, struct frag_ports);
	__uint(max_entries, 8192);
} cel_frag4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct frag6_key);
	__type(value, struct frag_ports);
	__uint(max_entries, 8192);
} cel_frag6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_key);
	__type(value, struct lb4_service);
	__uint(max_entries, 65536);
} cel_lb4_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_backend);
	__uint(max_entries, 65536);
} cel_lb4_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16);
	__type(value, struct lb4_reverse_nat);
	__uint(max_entries, 65536);
} cel_lb4_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb6_key);
	__type(value, struct lb4_service); /* the same slots as IPv4's */
	__uint(max_entries, 65536);
} cel_lb6_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb6_backend);
	__uint(max_entries, 65536);
} cel_lb6_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16);
	__type(value, struct lb6_reverse_nat);
	__uint(max_entries, 65536);
} cel_lb6_revnat SEC(".maps");

/* LRU: an entry outlives its connection until newer ones need the room; a
 * reply always finds its own, which every packet of the connection renews. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct snat4_value);
	__uint(max_entries, 65536);
} cel_snat4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct6_key);
	__type(value, struct snat6_value);
	__uint(max_entries, 65536);
} cel_snat6 SEC(".maps");

/* Destinations pods' packets keep their own source to (lib/masq.h): the
 * native routing CIDRs, the ip-masq-agent's nonMasqueradeCIDRs and other
 * nodes' pod CIDRs, both families (keys as cel_ipcache's); the value says
 * whose (CEL_IPMASQ_* bits). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, __u8);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} cel_ipmasq SEC(".maps");

/* The node's devices cel_from_netdev is attached to (ifindex -> 1), written
 * by the agent as it attaches and detaches: only a connection leaving by one
 * of them is masqueraded, as only there do its replies meet the program that
 * translates them back. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u8);
	__uint(max_entries, 1024);
} cel_netdevs SEC(".maps");

/* A socket's entries live as long as it may ask; LRU forgets those of
 * sockets long closed (a socket cookie is never reused). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_rev4_key);
	__type(value, struct sock_rev4_value);
	__uint(max_entries, 65536);
} cel_lb4_reverse_sk SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_rev6_key);
	__type(value, struct sock_rev6_value);
	__uint(max_entries, 65536);
} cel_lb6_reverse_sk SEC(".maps");

/* Maglev lookup tables by rev-NAT id (cellium/lb.h). BPF_F_INNER_MAP: the
 * inner arrays may be of any size, so a table size change needs no new
 * outer map. Only maglev frontends hold a table. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u16);
	__type(value, __u32);
	__uint(max_entries, 65536);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_ARRAY);
		__uint(map_flags, BPF_F_INNER_MAP);
		__type(key, __u32);
		__type(value, __u32);
		__uint(max_entries, 1);
	});
} cel_lb_maglev SEC(".maps");

/* Session affinity: a client's last choice per frontend (LRU: forgetting
 * an idle client only costs it its affinity), and which backends each
 * frontend with affinity has (written by svc-lb). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_affinity_key);
	__type(value, struct lb_affinity_val);
	__uint(max_entries, 65536);
} cel_lb4_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_affinity_key);
	__type(value, struct lb_affinity_val);
	__uint(max_entries, 65536);
} cel_lb6_affinity SEC(".maps");

/* loadBalancerSourceRanges (lib/lb.h lb4_src_range_ok): written by the
 * agent per rev-NAT id. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb4_src_range_key);
	__type(value, __u8);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} cel_lb4_source_range SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb6_src_range_key);
	__type(value, __u8);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} cel_lb6_source_range SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_affinity_match);
	__type(value, __u8);
	__uint(max_entries, 65536);
} cel_lb_affinity_match SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct datapath_config);
	__uint(max_entries, 1);
} cel_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct metrics_value);
	__uint(max_entries, CEL_DIR_MAX * CEL_REASON_SLOTS);
} cel_metrics SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
} cel_events SEC(".maps");

#endif /* CELLIUM_LIB_MAPS_H */
