/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Tunnel mode (routing-mode: tunnel): traffic from a pod to a pod of another
 * node is handed to the node's VXLAN device with a tunnel key naming that
 * node (from the ipcache) and carrying the source's security identity as the
 * VNI, as Cilium does; the receiving node's cel_from_overlay reads the
 * identity back and enforces ingress policy with it.
 *
 * The keys live in a per-CPU scratch map, not on the stack: the calling
 * programs already use most of the 512 bytes BPF allows.
 */
#ifndef CELLIUM_LIB_TUNNEL_H
#define CELLIUM_LIB_TUNNEL_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "maps.h"
#include "packet.h"

struct tunnel_scratch {
	struct ipcache_key lookup;
	struct bpf_tunnel_key key;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct tunnel_scratch);
	__uint(max_entries, 1);
} cel_tunnel_scratch SEC(".maps");

/* The VNI is 24 bits wide: identities beyond it cannot be carried. */
#define CEL_TUNNEL_VNI_MAX 0xffffff

/* Not tunnelled: the packet goes on as in native routing. */
#define TUNNEL_PASS -1

static __always_inline struct tunnel_scratch *tunnel_scratch(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cel_tunnel_scratch, &zero);
}

/* Sets the tunnel key when tunnel mode is on and the ipcache names a node
 * hosting addr (4 or 16 address bytes by family). Returns 0 when the caller
 * is to redirect the packet to cfg->tunnel_ifindex, TUNNEL_PASS when the
 * packet is not tunnelled, or a CEL_REASON_* (> 0) to drop it with. */
static __always_inline int tunnel_to(struct __sk_buff *skb, const struct datapath_config *cfg,
				     __u8 family, const void *addr, __u32 src_identity)
{
	struct tunnel_scratch *s;
	struct ipcache_value *v;

	if (!cfg || !cfg->tunnel_ifindex)
		return TUNNEL_PASS;
	s = tunnel_scratch();
	if (!s)
		return TUNNEL_PASS;
	__builtin_memset(&s->lookup, 0, sizeof(s->lookup));
	s->lookup.family = family;
	if (family == CEL_FAMILY_IPV4) {
		s->lookup.prefixlen = 32 + 32;
		__builtin_memcpy(s->lookup.addr, addr, 4);
	} else {
		s->lookup.prefixlen = 32 + 128;
		__builtin_memcpy(s->lookup.addr, addr, 16);
	}
	v = bpf_map_lookup_elem(&cel_ipcache, &s->lookup);
	if (!v || !v->tunnel_endpoint)
		return TUNNEL_PASS;
	if (src_identity > CEL_TUNNEL_VNI_MAX)
		return CEL_REASON_ENCAP_FAILED;
	__builtin_memset(&s->key, 0, sizeof(s->key));
	/* The helper takes the remote IPv4 address in host order. */
	s->key.remote_ipv4 = bpf_ntohl(v->tunnel_endpoint);
	s->key.tunnel_id = src_identity;
	s->key.tunnel_ttl = 64;
	if (bpf_skb_set_tunnel_key(skb, &s->key, sizeof(s->key), BPF_F_ZERO_CSUM_TX) < 0)
		return CEL_REASON_ENCAP_FAILED;
	return 0;
}

/* Whether the packet already has a tunnel key: a pod's, set by
 * cel_from_container before the redirect to the device. */
static __always_inline int tunnel_has_key(struct __sk_buff *skb)
{
	struct tunnel_scratch *s = tunnel_scratch();

	return s && bpf_skb_get_tunnel_key(skb, &s->key, sizeof(s->key), 0) == 0;
}

/* The source identity a packet out of the tunnel carries in its VNI; 0 when
 * it has no tunnel key. The sending node's own traffic (host) is, seen from
 * here, remote-node, as in Cilium. */
static __always_inline __u32 tunnel_source_identity(struct __sk_buff *skb)
{
	struct tunnel_scratch *s = tunnel_scratch();
	__u32 id;

	if (!s)
		return 0;
	__builtin_memset(&s->key, 0, sizeof(s->key));
	if (bpf_skb_get_tunnel_key(skb, &s->key, sizeof(s->key), 0) < 0)
		return 0;
	id = s->key.tunnel_id;
	return id == CEL_IDENTITY_HOST ? CEL_IDENTITY_REMOTE_NODE : id;
}

/* Whether an IPv4 packet off one of the node's devices is the tunnel's own:
 * UDP to the VXLAN device's port (no later fragment, which has no port). The
 * kernel's VXLAN socket takes those and hands the inner packet to
 * cel_from_overlay; nothing cel_from_netdev does (node ports, the fast path
 * to local pods) applies to the outer packet, so it is passed on at once
 * rather than parsed and looked up for nothing, once per packet between
 * nodes. A node port on the tunnel's port could not be served anyway: the
 * VXLAN socket holds it. */
static __always_inline int tunnel_own_packet4(struct __sk_buff *skb,
					      const struct datapath_config *cfg)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	__be16 *ports;

	if (!cfg || !cfg->tunnel_port)
		return 0;
	if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_UDP ||
	    ip->frag_off & bpf_htons(CEL_IP_OFFSET))
		return 0;
	ports = (void *)ip + ip->ihl * 4;
	if ((void *)(ports + 2) > data_end)
		return 0;
	return ports[1] == cfg->tunnel_port;
}

#endif /* CELLIUM_LIB_TUNNEL_H */
