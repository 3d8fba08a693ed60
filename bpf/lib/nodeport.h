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

/* The protocols cel_snat4/6 may hold a connection of: TCP and UDP (NodePort
 * and masquerading), ICMP echo (masquerading, the identifier as the port). */
static __always_inline int snat_proto(__u8 protocol)
{
	return protocol == CEL_PROTO_TCP || protocol == CEL_PROTO_UDP ||
	       protocol == CEL_PROTO_ICMP || protocol == CEL_PROTO_ICMPV6;
}

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

/* Whether the connection whose conntrack entry is `e` is over: gone, expired
 * or closing. Its translated tuple may then carry another connection, as
 * netfilter reuses a closed connection's tuple: a burst of short
 * connections to one server would otherwise hold every port of the range
 * until their entries are collected. */
static __always_inline int snat_owner_done(const struct ct_entry *e)
{
	return !e || e->expires_ns <= bpf_ktime_get_ns() || e->state == CEL_CT_STATE_CLOSING;
}

/* Whether the reply tuple `rk` may carry client `v`: it already does, or
 * nobody's, not even a connection of the node's own, uses it, or the
 * connection that did is over (snat_owner_done). */
static __always_inline int snat4_free(const struct ct_key *rk, const struct snat4_value *v)
{
	struct snat4_value *have = bpf_map_lookup_elem(&cel_snat4, rk);
	struct ct_key own = {};

	if (have) {
		if (have->addr == v->addr && have->port == v->port)
			return 1;
		/* The previous client's own tuple, as its conntrack entry has it. */
		own.saddr = have->addr;
		own.daddr = rk->saddr;
		own.sport = have->port;
		own.dport = rk->sport;
		own.protocol = rk->protocol;
		return snat_owner_done(bpf_map_lookup_elem(&cel_ct4, &own));
	}
	own.saddr = rk->daddr;
	own.daddr = rk->saddr;
	own.sport = rk->dport;
	own.dport = rk->sport;
	own.protocol = rk->protocol;
	return !bpf_map_lookup_elem(&cel_ct4, &own);
}

/* snat4's keys and values, in memory of the caller's choice (masquerading
 * keeps them off the stack of cel_from_container's call chain). */
struct snat4_work {
	struct ct_key fk, rk;
	struct snat4_value client, given;
};

/* A port drawn at random from CEL_SNAT_PORT_MIN..MAX. */
static __always_inline __u16 snat_port_draw(void)
{
	return CEL_SNAT_PORT_MIN +
	       bpf_get_prandom_u32() % (CEL_SNAT_PORT_MAX - CEL_SNAT_PORT_MIN + 1);
}

/* The client's source becomes addr and a port free towards its peer (see
 * the top): after lb4_dnat for a NodePort client (keep_port: its own port
 * when free), or a pod's packet to the world (masquerading, lib/masq.h: a
 * port of the range from the start). A connection already translated keeps
 * its port and writes nothing. Returns 0 or CEL_REASON_NAT_FAILED. */
static __always_inline int snat4_in(struct __sk_buff *skb, struct pkt *p, __be32 addr,
				    int keep_port, struct snat4_work *w)
{
	struct snat4_value *was, *have;
	__u16 port = keep_port ? bpf_ntohs(p->sport) : snat_port_draw();
	int i;

	w->client.addr = p->saddr;
	w->client.port = p->sport;
	w->client.pad = 0;
	w->given.addr = addr;
	w->given.port = 0;
	w->given.pad = 0;
	ct_key_from_pkt(&w->fk, p, CEL_SNAT_F_FORWARD);
	__builtin_memset(&w->rk, 0, sizeof(w->rk));
	w->rk.saddr = p->daddr;
	w->rk.daddr = addr;
	w->rk.sport = p->dport;
	w->rk.protocol = p->protocol;
	was = bpf_map_lookup_elem(&cel_snat4, &w->fk);
	if (was && was->addr == addr) {
		/* Both entries in place (the lookups keep them recent in the
		 * LRU): the connection's every later packet ends here. */
		w->rk.dport = was->port;
		have = bpf_map_lookup_elem(&cel_snat4, &w->rk);
		if (have && have->addr == w->client.addr && have->port == w->client.port)
			return nat4_rewrite(skb, p, NAT_SRC, addr, w->rk.dport);
		port = bpf_ntohs(was->port);
	}
#pragma unroll
	for (i = 0; i < CEL_SNAT_TRIES; i++) {
		w->rk.dport = bpf_htons(port);
		if (snat4_free(&w->rk, &w->client)) {
			w->given.port = w->rk.dport;
			if (bpf_map_update_elem(&cel_snat4, &w->rk, &w->client, BPF_ANY) < 0 ||
			    bpf_map_update_elem(&cel_snat4, &w->fk, &w->given, BPF_ANY) < 0)
				return CEL_REASON_NAT_FAILED;
			return nat4_rewrite(skb, p, NAT_SRC, addr, w->rk.dport);
		}
		port = snat_port_draw();
	}
	return CEL_REASON_NAT_FAILED;
}

static __always_inline int snat4(struct __sk_buff *skb, struct pkt *p, __be32 addr, int keep_port)
{
	struct snat4_work w = {};

	return snat4_in(skb, p, addr, keep_port, &w);
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

	if (!snat_proto(p->protocol))
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

	if (!snat_proto(p->protocol))
		return 0;
	ct_key_from_pkt(&rk, p, 0);
	return bpf_map_lookup_elem(&cel_snat4, &rk) != NULL;
}

static __always_inline int snat6_reply(const struct pkt6 *p)
{
	struct ct6_key rk = {};

	if (!snat_proto(p->protocol))
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

/* snat4_free for IPv6; `own` is room for the conntrack key. */
static __always_inline int snat6_free(const struct ct6_key *rk, const struct snat6_value *v,
				      struct ct6_key *own)
{
	struct snat6_value *have = bpf_map_lookup_elem(&cel_snat6, rk);

	if (have) {
		if (ipv6_equal(have->addr, v->addr) && have->port == v->port)
			return 1;
		__builtin_memcpy(own->saddr, have->addr, 16);
		__builtin_memcpy(own->daddr, rk->saddr, 16);
		own->sport = have->port;
		own->dport = rk->sport;
		own->protocol = rk->protocol;
		own->flags = 0;
		own->pad = 0;
		return snat_owner_done(bpf_map_lookup_elem(&cel_ct6, own));
	}
	__builtin_memcpy(own->saddr, rk->daddr, 16);
	__builtin_memcpy(own->daddr, rk->saddr, 16);
	own->sport = rk->dport;
	own->dport = rk->sport;
	own->protocol = rk->protocol;
	own->flags = 0;
	own->pad = 0;
	return !bpf_map_lookup_elem(&cel_ct6, own);
}

/* snat4_work for IPv6, with snat6_free's key (own). */
struct snat6_work {
	struct ct6_key fk, rk, own;
	struct snat6_value client, given;
};

/* snat4_in for IPv6. */
static __always_inline int snat6_in(struct __sk_buff *skb, struct pkt6 *p, const __u8 *addr,
				    int keep_port, struct snat6_work *w)
{
	struct snat6_value *was, *have;
	__u16 port = keep_port ? bpf_ntohs(p->sport) : snat_port_draw();
	int i;

	__builtin_memcpy(w->client.addr, p->saddr, 16);
	w->client.port = p->sport;
	w->client.pad = 0;
	__builtin_memcpy(w->given.addr, addr, 16);
	w->given.port = 0;
	w->given.pad = 0;
	ct6_key_from_pkt(&w->fk, p, CEL_SNAT_F_FORWARD);
	__builtin_memset(&w->rk, 0, sizeof(w->rk));
	__builtin_memcpy(w->rk.saddr, p->daddr, 16);
	__builtin_memcpy(w->rk.daddr, addr, 16);
	w->rk.sport = p->dport;
	w->rk.protocol = p->protocol;
	was = bpf_map_lookup_elem(&cel_snat6, &w->fk);
	if (was && ipv6_equal(was->addr, addr)) {
		w->rk.dport = was->port;
		have = bpf_map_lookup_elem(&cel_snat6, &w->rk);
		if (have && ipv6_equal(have->addr, w->client.addr) && have->port == w->client.port)
			return nat6_rewrite(skb, p, NAT_SRC, w->given.addr, w->rk.dport);
		port = bpf_ntohs(was->port);
	}
#pragma unroll
	for (i = 0; i < CEL_SNAT_TRIES; i++) {
		w->rk.dport = bpf_htons(port);
		if (snat6_free(&w->rk, &w->client, &w->own)) {
			w->given.port = w->rk.dport;
			if (bpf_map_update_elem(&cel_snat6, &w->rk, &w->client, BPF_ANY) < 0 ||
			    bpf_map_update_elem(&cel_snat6, &w->fk, &w->given, BPF_ANY) < 0)
				return CEL_REASON_NAT_FAILED;
			return nat6_rewrite(skb, p, NAT_SRC, w->given.addr, w->rk.dport);
		}
		port = snat_port_draw();
	}
	return CEL_REASON_NAT_FAILED;
}

static __always_inline int snat6(struct __sk_buff *skb, struct pkt6 *p, const __u8 *addr,
				 int keep_port)
{
	struct snat6_work w = {};

	return snat6_in(skb, p, addr, keep_port, &w);
}

static __always_inline int unsnat6(struct __sk_buff *skb, struct pkt6 *p)
{
	struct snat6_value *client;
	struct ct6_key rk = {};
	__u8 addr[16];
	__be16 port;

	if (!snat_proto(p->protocol))
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
