/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Frontends reached from outside the node (NodePort, external IPs, load
 * balancer ingress IPs; slot 0 flag CEL_SVC_F_EXTERNAL): what
 * cel_from_netdev adds to the ClusterIP translation of lib/lb.h.
 *
 * With externalTrafficPolicy Cluster (the default) the client's source is
 * translated to the frontend's address (for a NodePort, the node's address
 * the client sent to), as kube-proxy masquerades, so that the backend's
 * replies come back through this node wherever the backend is. The source
 * port stays the client's when no other client holds it towards the same
 * backend; otherwise one is drawn at random from CEL_SNAT_PORT_MIN..MAX,
 * above the kernel's ephemeral range. cel_snat4/6 remember, per connection,
 * the source given (forward entry) and the client a reply goes back to
 * (reverse entry, keyed on the reply's tuple). With Local the client keeps
 * its address and no entry is written. A translated connection reaches
 * another node's backend as this node's (remote-node there), so only a
 * local backend's policy judges the client itself (docs/services.md).
 *
 * Replies leave the node with the frontend's address, which is the node's
 * own for a NodePort: the node's stack would drop such a packet as a
 * martian when forwarding it, so they are routed past it (lib/fib.h).
 */
#ifndef CELLIUM_LIB_NODEPORT_H
#define CELLIUM_LIB_NODEPORT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "conntrack.h"
#include "ipv6.h"
#include "lb.h"
#include "maps.h"
#include "nat.h"
#include "packet.h"

#define CEL_SNAT_PORT_MIN 61000
#define CEL_SNAT_PORT_MAX 65535
/* Random draws before a new connection is refused (CEL_REASON_NAT_FAILED):
 * with 4536 ports per backend, failing them all means the range is full. */
#define CEL_SNAT_TRIES 6

/* Slot 0 of the frontend the packet is for, if it is reached from outside.
 * A later fragment has the ports its first fragment recorded (frag4_track,
 * in nodeport4). */
static __always_inline struct lb4_service *lb4_external(const struct pkt *p)
{
	struct lb4_key k = {};
	struct lb4_service *svc;

	if (p->protocol != CEL_PROTO_TCP && p->protocol != CEL_PROTO_UDP)
		return NULL;
	k.vip = p->daddr;
	k.dport = p->dport;
	k.protocol = p->protocol;
	svc = bpf_map_lookup_elem(&cel_lb4_services, &k);
	return svc && (svc->flags & CEL_SVC_F_EXTERNAL) ? svc : NULL;
}

static __always_inline struct lb4_service *lb6_external(const struct pkt6 *p)
{
	struct lb6_key k = {};
	struct lb4_service *svc;

	if (p->protocol != CEL_PROTO_TCP && p->protocol != CEL_PROTO_UDP)
		return NULL;
	__builtin_memcpy(k.vip, p->daddr, 16);
	k.dport = p->dport;
	k.protocol = p->protocol;
	svc = bpf_map_lookup_elem(&cel_lb6_services, &k);
	return svc && (svc->flags & CEL_SVC_F_EXTERNAL) ? svc : NULL;
}

/* Whether the reply tuple `rk` may carry client `v`: it already does, or
 * nobody's, not even a connection of the node's own, uses it. */
static __always_inline int snat4_free(const struct ct_key *rk, const struct snat4_value *v)
{
	struct snat4_value *have = bpf_map_lookup_elem(&cel_snat4, rk);
	struct ct_key own = {};

	if (have)
		return have->addr == v->addr && have->port == v->port;
	own.saddr = rk->daddr;
	own.daddr = rk->saddr;
	own.sport = rk->dport;
	own.dport = rk->sport;
	own.protocol = rk->protocol;
	return !bpf_map_lookup_elem(&cel_ct4, &own);
}

/* After lb4_dnat: the client's source becomes addr and a port free towards
 * the backend (see the top). Returns 0 or CEL_REASON_NAT_FAILED. */
static __always_inline int snat4(struct __sk_buff *skb, struct pkt *p, __be32 addr)
{
	struct snat4_value client = { .addr = p->saddr, .port = p->sport };
	struct snat4_value given = { .addr = addr };
	struct ct_key fk = {}, rk = {};
	struct snat4_value *was;
	__u16 port = bpf_ntohs(p->sport);
	int i;

	ct_key_from_pkt(&fk, p, CEL_SNAT_F_FORWARD);
	was = bpf_map_lookup_elem(&cel_snat4, &fk);
	if (was && was->addr == addr)
		port = bpf_ntohs(was->port);
	rk.saddr = p->daddr;
	rk.daddr = addr;
	rk.sport = p->dport;
	rk.protocol = p->protocol;
#pragma unroll
	for (i = 0; i < CEL_SNAT_TRIES; i++) {
		rk.dport = bpf_htons(port);
		if (snat4_free(&rk, &client)) {
			given.port = rk.dport;
			if (bpf_map_update_elem(&cel_snat4, &rk, &client, BPF_ANY) < 0 ||
			    bpf_map_update_elem(&cel_snat4, &fk, &given, BPF_ANY) < 0)
				return CEL_REASON_NAT_FAILED;
			return nat4_rewrite(skb, p, NAT_SRC, addr, rk.dport);
		}
		port = CEL_SNAT_PORT_MIN +
		       bpf_get_prandom_u32() % (CEL_SNAT_PORT_MAX - CEL_SNAT_PORT_MIN + 1);
	}
	return CEL_REASON_NAT_FAILED;
}

/* A backend's reply to a source-translated client: its destination becomes
 * the client again, before anything else looks at it. Returns 0 or
 * CEL_REASON_NAT_FAILED. */
static __always_inline int unsnat4(struct __sk_buff *skb, struct pkt *p)
{
	struct snat4_value *client;
	struct ct_key rk = {};
	__be32 addr;
	__be16 port;

	if (p->protocol != CEL_PROTO_TCP && p->protocol != CEL_PROTO_UDP)
		return 0;
	ct_key_from_pkt(&rk, p, 0);
	client = bpf_map_lookup_elem(&cel_snat4, &rk);
	if (!client)
		return 0;
	addr = client->addr;
	port = client->port;
	return nat4_rewrite(skb, p, NAT_DST, addr, port);
}

/* Whether the packet is a reply to a source-translated client. */
static __always_inline int snat4_reply(const struct pkt *p)
{
	struct ct_key rk = {};

	if (p->protocol != CEL_PROTO_TCP && p->protocol != CEL_PROTO_UDP)
		return 0;
	ct_key_from_pkt(&rk, p, 0);
	return bpf_map_lookup_elem(&cel_snat4, &rk) != NULL;
}

static __always_inline int snat6_reply(const struct pkt6 *p)
{
	struct ct6_key rk = {};

	if (p->protocol != CEL_PROTO_TCP && p->protocol != CEL_PROTO_UDP)
		return 0;
	ct6_key_from_pkt(&rk, p, 0);
	return bpf_map_lookup_elem(&cel_snat6, &rk) != NULL;
}

/* After reverse NAT: whether the reply's source is a frontend reached from
 * outside (so the reply is routed past the node's stack). */
static __always_inline int lb4_external_reply(const struct pkt *p)
{
	struct lb4_key k = {};
	struct lb4_service *svc;

	k.vip = p->saddr;
	k.dport = p->sport;
	k.protocol = p->protocol;
	svc = bpf_map_lookup_elem(&cel_lb4_services, &k);
	return svc && (svc->flags & CEL_SVC_F_EXTERNAL);
}

static __always_inline int snat6_free(const struct ct6_key *rk, const struct snat6_value *v)
{
	struct snat6_value *have = bpf_map_lookup_elem(&cel_snat6, rk);
	struct ct6_key own = {};

	if (have)
		return ipv6_equal(have->addr, v->addr) && have->port == v->port;
	__builtin_memcpy(own.saddr, rk->daddr, 16);
	__builtin_memcpy(own.daddr, rk->saddr, 16);
	own.sport = rk->dport;
	own.dport = rk->sport;
	own.protocol = rk->protocol;
	return !bpf_map_lookup_elem(&cel_ct6, &own);
}

/* snat4 for IPv6. */
static __always_inline int snat6(struct __sk_buff *skb, struct pkt6 *p, const __u8 *addr)
{
	struct snat6_value client = { .port = p->sport };
	struct snat6_value given = {};
	struct ct6_key fk = {}, rk = {};
	struct snat6_value *was;
	__u16 port = bpf_ntohs(p->sport);
	int i;

	__builtin_memcpy(client.addr, p->saddr, 16);
	__builtin_memcpy(given.addr, addr, 16);
	ct6_key_from_pkt(&fk, p, CEL_SNAT_F_FORWARD);
	was = bpf_map_lookup_elem(&cel_snat6, &fk);
	if (was && ipv6_equal(was->addr, addr))
		port = bpf_ntohs(was->port);
	__builtin_memcpy(rk.saddr, p->daddr, 16);
	__builtin_memcpy(rk.daddr, addr, 16);
	rk.sport = p->dport;
	rk.protocol = p->protocol;
#pragma unroll
	for (i = 0; i < CEL_SNAT_TRIES; i++) {
		rk.dport = bpf_htons(port);
		if (snat6_free(&rk, &client)) {
			given.port = rk.dport;
			if (bpf_map_update_elem(&cel_snat6, &rk, &client, BPF_ANY) < 0 ||
			    bpf_map_update_elem(&cel_snat6, &fk, &given, BPF_ANY) < 0)
				return CEL_REASON_NAT_FAILED;
			return nat6_rewrite(skb, p, NAT_SRC, given.addr, rk.dport);
		}
		port = CEL_SNAT_PORT_MIN +
		       bpf_get_prandom_u32() % (CEL_SNAT_PORT_MAX - CEL_SNAT_PORT_MIN + 1);
	}
	return CEL_REASON_NAT_FAILED;
}

static __always_inline int unsnat6(struct __sk_buff *skb, struct pkt6 *p)
{
	struct snat6_value *client;
	struct ct6_key rk = {};
	__u8 addr[16];
	__be16 port;

	if (p->protocol != CEL_PROTO_TCP && p->protocol != CEL_PROTO_UDP)
		return 0;
	ct6_key_from_pkt(&rk, p, 0);
	client = bpf_map_lookup_elem(&cel_snat6, &rk);
	if (!client)
		return 0;
	__builtin_memcpy(addr, client->addr, 16);
	port = client->port;
	return nat6_rewrite(skb, p, NAT_DST, addr, port);
}

static __always_inline int lb6_external_reply(const struct pkt6 *p)
{
	struct lb6_key k = {};
	struct lb4_service *svc;

	__builtin_memcpy(k.vip, p->saddr, 16);
	k.dport = p->sport;
	k.protocol = p->protocol;
	svc = bpf_map_lookup_elem(&cel_lb6_services, &k);
	return svc && (svc->flags & CEL_SVC_F_EXTERNAL);
}

#endif /* CELLIUM_LIB_NODEPORT_H */
