// SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0)
/*
 * The Cellium datapath: one object for every endpoint. Both programs sit on
 * the host-side veth of a pod; everything endpoint-specific comes from maps.
 *
 *   cel_from_container  TC ingress: packets the pod sends.
 *     source check -> later fragments take their first's ports -> an ICMP
 *     error about a known connection is that connection's (lib/related.h:
 *     translated back, forwarded past policy) -> service DNAT (backend
 *     chosen, nothing written; no backend: refused with a port
 *     unreachable, or dropped; back to the client itself: its source
 *     becomes the service loopback address) -> conntrack ->
 *     (new: egress policy of the source, ingress policy of a local
 *     destination) -> service entry recorded -> reverse NAT of replies
 *     (a hairpin reply back to the pod that sent it) -> redirect into a
 *     local pod, or up the node's stack.
 *   cel_to_container    TC egress: packets the node's stack sends to the pod.
 *     later fragments take their first's ports -> related errors ->
 *     conntrack -> (new: ingress policy) -> reverse NAT of replies.
 *
 * IPv4 and IPv6 take the same steps over maps of their own family
 * (conntrack, fragments, services); IPv6 also lets the link-local control
 * both stacks need pass whatever the policy, and answers a pod's neighbour
 * solicitations for the node (lib/nd.h). Non-IP frames (ARP) pass untouched.
 *
 * The cel_sock* programs sit on a cgroup instead (bpf-lb-sock): they
 * translate services where the node's own sockets name their peers
 * (lib/sock.h).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lib/conntrack.h"
#include "lib/dsr.h"
#include "lib/fib.h"
#include "lib/frag.h"
#include "lib/ipv6.h"
#include "lib/lb.h"
#include "lib/lookup.h"
#include "lib/masq.h"
#include "lib/maps.h"
#include "lib/nat.h"
#include "lib/nd.h"
#include "lib/nodeport.h"
#include "lib/notify.h"
#include "lib/packet.h"
#include "lib/policy.h"
#include "lib/reject.h"
#include "lib/related.h"
#include "lib/scratch.h"
#include "lib/sock.h"
#include "lib/tunnel.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Hands the frame to a local pod's eth0, skipping the node's stack (and
 * therefore that pod's cel_to_container, whose checks were done here).
 * Returns the verdict, or -1 if the MACs could not be rewritten. */
static __always_inline int redirect_to_endpoint(struct __sk_buff *skb, __u8 direction,
						const struct endpoint_info *dst)
{
	__u8 macs[12];
	__u32 ifindex = dst->ifindex;

	__builtin_memcpy(&macs[0], dst->pod_mac, 6);
	__builtin_memcpy(&macs[6], dst->host_mac, 6);
	if (bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0) < 0)
		return -1;
	count(direction, CEL_REASON_FORWARDED, skb->len);
	return bpf_redirect_peer(ifindex, 0);
}

/* CEL_CT_F_SRC_LOCAL if the sender of a connection's first packet, which
 * came from outside a pod's own program, is a local endpoint all the same. */
static __always_inline __u8 ct_src_local4(const struct pkt *p)
{
	return endpoint_lookup4(p->saddr) ? CEL_CT_F_SRC_LOCAL : 0;
}

static __always_inline __u8 ct_src_local6(const struct pkt6 *p)
{
	return endpoint_lookup6(p->saddr) ? CEL_CT_F_SRC_LOCAL : 0;
}

/* A known connection's packet delivered to the local endpoint `dst` at an end
 * its entry was not recorded for (ct_unchecked): the endpoint's ingress
 * policy decides, as for a new connection, and the entry is trusted for that
 * end once it admits. `t` becomes the ingress trace. Returns 0 or the
 * CEL_REASON_* to drop with. */
static __always_inline int ct_recheck4(struct __sk_buff *skb, const struct pkt *p,
				       struct trace *t, int ct, struct ct_entry *ce,
				       const struct endpoint_info *dst, __u32 src_identity,
				       const struct datapath_config *cfg)
{
	__u8 im = CEL_MATCH_NONE;
	int ret;

	t->direction = CEL_DIR_INGRESS;
	t->endpoint_id = dst->id;
	t->src_identity = src_identity;
	t->dst_identity = dst->identity;
	ret = policy_check(skb, p, t, dst, CEL_DIR_INGRESS, src_identity, cfg, &im);
	if (!ret)
		ct_mark_checked(ce, ct);
	return ret;
}

static __always_inline int ct_recheck6(struct __sk_buff *skb, const struct pkt6 *p,
				       struct trace *t, int ct, struct ct_entry *ce,
				       const struct endpoint_info *dst, __u32 src_identity,
				       const struct datapath_config *cfg)
{
	__u8 im = CEL_MATCH_NONE;
	int ret;

	t->direction = CEL_DIR_INGRESS;
	t->endpoint_id = dst->id;
	t->src_identity = src_identity;
	t->dst_identity = dst->identity;
	ret = policy_check6(skb, p, t, dst, CEL_DIR_INGRESS, src_identity, cfg, &im);
	if (!ret)
		ct_mark_checked(ce, ct);
	return ret;
}

/* IPv6 a pod sends: as cel_from_container does for IPv4, after link-local
 * control (which passes whatever the policy, to the link only, from the
 * pod's own, a link-local or the unspecified address) and the neighbour
 * solicitations the datapath answers for the node. */
static __always_inline int from_container6(struct __sk_buff *skb,
					   const struct datapath_config *cfg)
{
	struct trace t = { .direction = CEL_DIR_EGRESS };
	struct endpoint_info *src, *dst;
	struct lb6_choice *lb;
	struct ct_entry *ce = NULL;
	struct scratch6 *s = scratch6();
	struct ct6_key *key;
	struct pkt6 *p;
	int external = 0;
	__u64 now;
	__u32 len;
	int ret, ct = CT_REPLY; /* an ICMP error (goto forward) starts nothing */

	if (!s)
		return TC_ACT_SHOT;
	p = &s->p;
	key = &s->key;
	lb = &s->lb6;
	ret = parse_ipv6(skb, p);
	if (ret)
		return drop6(skb, p, &t, ret);

	/* The source counts as the pod's only if its entry names this very
	 * interface: another pod's address is as spoofed as a made-up one. */
	src = endpoint_lookup6(p->saddr);
	if (src && src->ifindex != skb->ifindex)
		src = NULL;
	if (src) {
		t.endpoint_id = src->id;
		t.src_identity = src->identity;
	}
	if (ipv6_link_control(p)) {
		ret = nd_answer(skb, p, src, cfg);
		if (ret >= 0)
			return ret;
		/* A pod's own ND and MLD: from the unspecified address (DAD),
		 * its link-local address (which it may choose freely, so it
		 * is not in the endpoint map) or one of its own; to the link. */
		if (ipv6_link_scope(p->daddr) &&
		    (src || ipv6_unspecified(p->saddr) || ipv6_link_local(p->saddr))) {
			count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, skb->len);
			return TC_ACT_OK;
		}
	}
	if (!src)
		return drop6(skb, p, &t, CEL_REASON_INVALID_SOURCE);
	ret = frag6_track(p);
	if (ret)
		return drop6(skb, p, &t, ret);
	/* An error about one of the node's connections is that connection's
	 * (lib/related.h): past policy, translated back to its frontend. */
	if (icmp6_is_error(p)) {
		ret = icmp6_related(skb, p, 0, src->identity);
		if (ret > 0)
			return drop6(skb, p, &t, ret);
		if (ret != CEL_RELATED_NONE) {
			external = ret == CEL_RELATED_EXTERNAL;
			dst = endpoint_lookup6(p->daddr);
			goto forward;
		}
	}
	/* A reply to a source-translated client from outside: to it again. */
	ret = unsnat6(skb, p);
	if (ret)
		return drop6(skb, p, &t, ret);

	now = bpf_ktime_get_ns();
	ret = lb6_dnat(skb, p, cfg, now, lb);
	if (ret == CEL_REASON_NO_SERVICE_BACKEND && service_reject(cfg))
		return reject6(skb, p, &t);
	if (ret)
		return drop6(skb, p, &t, ret);
	ret = lb6_hairpin(skb, p, lb);
	if (ret)
		return drop6(skb, p, &t, ret);
	ret = lb6_unclash(skb, p, lb, key, now);
	if (ret)
		return drop6(skb, p, &t, ret);

	/* After DNAT: the destination is the backend. */
	dst = endpoint_lookup6(p->daddr);
	ct6_key_from_pkt(key, p, 0);
	ct = ct_lookup6(key, p, cfg, now, &ce);
	if (ct_unchecked(ct, ce, dst)) {
		struct trace it = t;

		ret = ct_recheck6(skb, p, &it, ct, ce, dst, t.src_identity, cfg);
		if (ret)
			return drop6(skb, p, &it, ret);
	}
	if (ct == CT_NEW) {
		__u8 em = CEL_MATCH_NONE, im = CEL_MATCH_NONE;

		t.dst_identity = dst ? dst->identity : ipcache_identity6(cfg, p->daddr);
		ret = policy_check6(skb, p, &t, src, CEL_DIR_EGRESS, t.dst_identity, cfg, &em);
		if (ret)
			return drop6(skb, p, &t, ret);
		if (dst) {
			struct trace it = t;

			it.direction = CEL_DIR_INGRESS;
			it.endpoint_id = dst->id;
			ret = policy_check6(skb, p, &it, dst, CEL_DIR_INGRESS, t.src_identity, cfg,
					    &im);
			if (ret)
				return drop6(skb, p, &it, ret);
		}
		ret = ct_create6_flags(key, p, cfg, now, lb->rev_nat_id, lb->backend_id,
				       CEL_CT_F_SRC_LOCAL | (dst ? CEL_CT_F_DST_LOCAL : 0));
		if (ret)
			return drop6(skb, p, &t, ret);
		lb6_note_clash(key, lb);
		if (trace_events(cfg))
			trace_new6(skb, p, &t, em | (im << 4), lb->rev_nat_id);
	} else if (ct == CT_REPLY && ce) {
		__u16 id = ce->rev_nat_id;

		if (id) {
			ret = lb6_hairpin_reply(skb, p);
			if (ret < 0)
				return drop6(skb, p, &t, CEL_REASON_NAT_FAILED);
			if (ret > 0)
				dst = src;
			ret = lb6_restore_port(skb, p, ce);
			if (ret)
				return drop6(skb, p, &t, ret);
			ret = lb6_rev_nat(skb, p, id, cfg, now);
			if (ret)
				return drop6(skb, p, &t, ret);
			external = lb6_external_reply(p);
		}
	}
	/* Past policy: the connection may now remember its backend. */
	ret = lb6_commit(lb, p, cfg, now);
	if (ret)
		return drop6(skb, p, &t, ret);

forward:
	if (dst) {
		ret = redirect_to_endpoint(skb, CEL_DIR_EGRESS, dst);
		return ret < 0 ? drop6(skb, p, &t, CEL_REASON_NAT_FAILED) : ret;
	}
	if (external) {
		count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, skb->len);
		return fib_redirect6(skb, p);
	}
	ret = tunnel_lookup(cfg, CEL_FAMILY_IPV6, p->daddr,
			    src ? src->cluster_identity : t.src_identity);
	if (ret > 0)
		return drop6(skb, p, &t, ret);
	len = skb->len;
	if (ret == 0) {
		ret = tunnel_send(skb, cfg);
		if (ret < 0)
			return drop6(skb, p, &t, -ret);
	} else {
		/* Not a cluster peer's: for the world, masqueraded and routed
		 * (lib/masq.h), or left to the node's stack. */
		ret = TC_ACT_OK;
		if (masq6_wanted(skb, cfg, s, ct == CT_NEW)) {
			ret = masq6_send(skb, s);
			if (ret < 0)
				return drop6(skb, p, &t, -ret);
		}
	}
	count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, len);
	return ret;
}

/* As endpoint_ingress4, for IPv6. */
static __always_inline int endpoint_ingress6(struct __sk_buff *skb, struct pkt6 *p,
					     struct trace *t, struct endpoint_info *dst,
					     __u32 src_identity, int netdev,
					     const struct datapath_config *cfg)
{
	struct ct_entry *ce = NULL;
	struct ct6_key key = {};
	__u64 now;
	int ret, ct;

	t->endpoint_id = dst->id;
	t->dst_identity = dst->identity;
	ret = frag6_track(p);
	if (ret)
		return ret;
	/* An error about one of this endpoint's connections: delivered as
	 * the connection's packets are, translated back to its frontend. */
	if (icmp6_is_error(p)) {
		ret = icmp6_related(skb, p, 0, src_identity);
		if (ret != CEL_RELATED_NONE)
			return ret > 0 ? ret : 0;
	}

	now = bpf_ktime_get_ns();
	ct6_key_from_pkt(&key, p, 0);
	ct = ct_lookup6(&key, p, cfg, now, &ce);
	if (ct_unchecked(ct, ce, dst)) {
		if (!src_identity)
			src_identity = netdev ? netdev_identity6(cfg, p->saddr) :
						identity_of6(cfg, p->saddr);
		ret = ct_recheck6(skb, p, t, ct, ce, dst, src_identity, cfg);
		if (ret)
			return ret;
	}
	if (ct == CT_NEW) {
		__u8 im = CEL_MATCH_NONE;

		if (!src_identity)
			src_identity = netdev ? netdev_identity6(cfg, p->saddr) :
						identity_of6(cfg, p->saddr);
		t->src_identity = src_identity;
		ret = policy_check6(skb, p, t, dst, CEL_DIR_INGRESS, t->src_identity, cfg, &im);
		if (ret)
			return ret;
		ret = ct_create6_flags(&key, p, cfg, now, 0, 0,
				       CEL_CT_F_DST_LOCAL | ct_src_local6(p));
		if (ret)
			return ret;
		if (trace_events(cfg))
			trace_new6(skb, p, t, im << 4, 0);
	} else if (ct == CT_REPLY && ce) {
		__u16 id = ce->rev_nat_id;

		if (id) {
			ret = lb6_restore_port(skb, p, ce);
			return ret ?: lb6_rev_nat(skb, p, id, cfg, now);
		}
	}
	return 0;
}

/* IPv6 the node's stack sends the pod: as cel_to_container does for IPv4,
 * after the node's link-local control (from the unspecified or a link-local
 * address, to the link or to the pod's own address). */
static __always_inline int to_container6(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	struct trace t = { .direction = CEL_DIR_INGRESS };
	struct endpoint_info *dst;
	struct pkt6 p = {};
	int ret;

	ret = parse_ipv6(skb, &p);
	if (ret)
		return drop6(skb, &p, &t, ret);

	dst = endpoint_lookup6(p.daddr);
	if (dst && dst->ifindex != skb->ifindex)
		dst = NULL;
	if (ipv6_link_control(&p) && (dst || ipv6_link_scope(p.daddr)) &&
	    (ipv6_unspecified(p.saddr) || ipv6_link_local(p.saddr))) {
		count(CEL_DIR_INGRESS, CEL_REASON_FORWARDED, skb->len);
		return TC_ACT_OK;
	}
	/* As for IPv4, only packets for the endpoint behind this interface
	 * are ours: the node routes nothing else here, and what it sends
	 * on the link itself (to link-local and multicast addresses) comes
	 * from the node, which every endpoint admits (allow-localhost). */
	if (!dst)
		return TC_ACT_OK;
	ret = endpoint_ingress6(skb, &p, &t, dst, 0, 0, cfg);
	if (ret)
		return drop6(skb, &p, &t, ret);
	count(CEL_DIR_INGRESS, CEL_REASON_FORWARDED, skb->len);
	return TC_ACT_OK;
}

SEC("tc")
int cel_from_container(struct __sk_buff *skb)
{
	struct datapath_config *cfg = config_get();
	struct trace t = { .direction = CEL_DIR_EGRESS };
	struct endpoint_info *src, *dst;
	struct lb4_choice *lb;
	struct scratch6 *s;
	struct ct_entry *ce = NULL;
	struct ct_key *key;
	struct pkt *p;
	int external = 0;
	__u64 now;
	__u32 len;
	int ret, ct = CT_REPLY; /* an ICMP error (goto forward) starts nothing */

	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return from_container6(skb, cfg);
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	s = scratch4();
	if (!s)
		return TC_ACT_SHOT;
	lb = &s->lb4;
	p = &s->p4;
	key = &s->key4;
	ret = parse_ipv4(skb, p);
	if (ret)
		return drop(skb, p, &t, ret);

	/* Anti-spoofing: the source address must belong to the endpoint
	 * behind this very interface. */
	src = endpoint_lookup4(p->saddr);
	if (!src || src->ifindex != skb->ifindex)
		return drop(skb, p, &t, CEL_REASON_INVALID_SOURCE);
	t.endpoint_id = src->id;
	t.src_identity = src->identity;
	ret = frag4_track(p);
	if (ret)
		return drop(skb, p, &t, ret);
	/* An error about one of the node's connections is that connection's
	 * (lib/related.h): past policy, translated back to its frontend. */
	if (icmp4_is_error(p)) {
		ret = icmp4_related(skb, p, 0, src->identity);
		if (ret > 0)
			return drop(skb, p, &t, ret);
		if (ret != CEL_RELATED_NONE) {
			external = ret == CEL_RELATED_EXTERNAL;
			dst = endpoint_lookup4(p->daddr);
			goto forward;
		}
	}
	/* A reply to a source-translated client from outside: to it again. */
	ret = unsnat4(skb, p);
	if (ret)
		return drop(skb, p, &t, ret);

	now = bpf_ktime_get_ns();
	ret = lb4_dnat(skb, p, cfg, now, lb);
	if (ret == CEL_REASON_NO_SERVICE_BACKEND && service_reject(cfg))
		return reject4(skb, p, &t);
	if (ret)
		return drop(skb, p, &t, ret);
	ret = lb4_hairpin(skb, p, lb);
	if (ret)
		return drop(skb, p, &t, ret);
	ret = lb4_unclash(skb, p, lb, key, now);
	if (ret)
		return drop(skb, p, &t, ret);

	/* After DNAT: the destination is the backend. */
	dst = endpoint_lookup4(p->daddr);
	ct_key_from_pkt(key, p, 0);
	ct = ct_lookup4(key, p, cfg, now, &ce);
	if (ct_unchecked(ct, ce, dst)) {
		struct trace it = t;

		ret = ct_recheck4(skb, p, &it, ct, ce, dst, t.src_identity, cfg);
		if (ret)
			return drop(skb, p, &it, ret);
	}
	if (ct == CT_NEW) {
		__u8 em = CEL_MATCH_NONE, im = CEL_MATCH_NONE;

		t.dst_identity = dst ? dst->identity : ipcache_identity4(cfg, p->daddr);
		ret = policy_check(skb, p, &t, src, CEL_DIR_EGRESS, t.dst_identity, cfg, &em);
		if (ret)
			return drop(skb, p, &t, ret);
		if (dst) {
			/* The redirect skips the destination's to-container
			 * program, so its ingress policy is decided here. */
			struct trace it = t;

			it.direction = CEL_DIR_INGRESS;
			it.endpoint_id = dst->id;
			ret = policy_check(skb, p, &it, dst, CEL_DIR_INGRESS, t.src_identity, cfg,
					   &im);
			if (ret)
				return drop(skb, p, &it, ret);
		}
		ret = ct_create4_flags(key, p, cfg, now, lb->rev_nat_id, lb->backend_id,
				       CEL_CT_F_SRC_LOCAL | (dst ? CEL_CT_F_DST_LOCAL : 0));
		if (ret)
			return drop(skb, p, &t, ret);
		lb4_note_clash(key, lb);
		/* One flag test per new connection: nothing when tracing is off. */
		if (trace_events(cfg))
			trace_new(skb, p, &t, em | (im << 4), lb->rev_nat_id);
	} else if (ct == CT_REPLY && ce) {
		__u16 id = ce->rev_nat_id;

		if (id) {
			/* A hairpin reply goes back to the pod that sent it. */
			ret = lb4_hairpin_reply(skb, p);
			if (ret < 0)
				return drop(skb, p, &t, CEL_REASON_NAT_FAILED);
			if (ret > 0)
				dst = src;
			ret = lb4_restore_port(skb, p, ce);
			if (ret)
				return drop(skb, p, &t, ret);
			ret = lb4_rev_nat(skb, p, id, cfg, now);
			if (ret)
				return drop(skb, p, &t, ret);
			external = lb4_external_reply(p);
		} else {
			/* A DSR reply: from the frontend, to the client. */
			ret = dsr4_reply(skb, p, cfg);
			if (ret < 0)
				return drop(skb, p, &t, -ret);
			external = ret;
		}
	}
	/* Past policy: the connection may now remember its backend. */
	ret = lb4_commit(lb, p, cfg, now);
	if (ret)
		return drop(skb, p, &t, ret);

forward:
	if (dst) {
		ret = redirect_to_endpoint(skb, CEL_DIR_EGRESS, dst);
		return ret < 0 ? drop(skb, p, &t, CEL_REASON_NAT_FAILED) : ret;
	}
	/* A reply from a frontend reached from outside (the node's own address,
	 * for a NodePort): routed past the stack, which would drop it. */
	if (external) {
		count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, skb->len);
		return fib_redirect4(skb, p);
	}
	ret = tunnel_lookup(cfg, CEL_FAMILY_IPV4, &p->daddr, src->cluster_identity);
	if (ret > 0)
		return drop(skb, p, &t, ret);
	if (ret == TUNNEL_PASS) {
		/* Not a cluster peer's: for the world, masqueraded (lib/masq.h). */
		if (masq4_wanted(skb, cfg, s, ct == CT_NEW)) {
			len = skb->len;
			ret = masq4_send(skb, s);
			if (ret < 0)
				return drop(skb, p, &t, -ret);
			count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, len);
			return ret;
		}
		count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, skb->len);
		return redirect_to_node4(skb, cfg, p);
	}
	len = skb->len;
	ret = tunnel_send(skb, cfg);
	if (ret < 0)
		return drop(skb, p, &t, -ret);
	count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, len);
	return ret;
}

/* A packet for local endpoint dst, past its interface checks: conntrack,
 * dst's ingress policy for a new connection (with the source identity
 * given, or resolved from the source address when 0: as one off a device,
 * never host, when netdev is set) and reverse NAT of replies. Returns 0 to
 * deliver, or the CEL_REASON_* to drop with. */
static __always_inline int endpoint_ingress4(struct __sk_buff *skb, struct pkt *p,
					     struct trace *t, struct endpoint_info *dst,
					     __u32 src_identity, int netdev,
					     const struct datapath_config *cfg)
{
	struct ct_entry *ce = NULL;
	struct ct_key key = {};
	__u64 now;
	int ret, ct;

	t->endpoint_id = dst->id;
	t->dst_identity = dst->identity;
	ret = frag4_track(p);
	if (ret)
		return ret;
	/* An error about one of this endpoint's connections: delivered as
	 * the connection's packets are, translated back to its frontend. */
	if (icmp4_is_error(p)) {
		ret = icmp4_related(skb, p, 0, src_identity);
		if (ret != CEL_RELATED_NONE)
			return ret > 0 ? ret : 0;
	}

	now = bpf_ktime_get_ns();
	ct_key_from_pkt(&key, p, 0);
	ct = ct_lookup4(&key, p, cfg, now, &ce);
	if (ct_unchecked(ct, ce, dst)) {
		if (!src_identity)
			src_identity = netdev ? netdev_identity4(cfg, p->saddr) :
						identity_of4(cfg, p->saddr);
		ret = ct_recheck4(skb, p, t, ct, ce, dst, src_identity, cfg);
		if (ret)
			return ret;
	}
	if (ct == CT_NEW) {
		__u8 im = CEL_MATCH_NONE;

		if (!src_identity)
			src_identity = netdev ? netdev_identity4(cfg, p->saddr) :
						identity_of4(cfg, p->saddr);
		t->src_identity = src_identity;
		ret = policy_check(skb, p, t, dst, CEL_DIR_INGRESS, t->src_identity, cfg, &im);
		if (ret)
			return ret;
		ret = ct_create4_flags(&key, p, cfg, now, 0, 0,
				       CEL_CT_F_DST_LOCAL | ct_src_local4(p));
		if (ret)
			return ret;
		if (trace_events(cfg))
			trace_new(skb, p, t, im << 4, 0);
	} else if (ct == CT_REPLY && ce) {
		__u16 id = ce->rev_nat_id;

		if (id) {
			ret = lb4_restore_port(skb, p, ce);
			return ret ?: lb4_rev_nat(skb, p, id, cfg, now);
		}
	}
	return 0;
}

SEC("tc")
int cel_to_container(struct __sk_buff *skb)
{
	struct datapath_config *cfg = config_get();
	struct trace t = { .direction = CEL_DIR_INGRESS };
	struct endpoint_info *dst;
	struct pkt p = {};
	int ret;

	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return to_container6(skb, cfg);
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	ret = parse_ipv4(skb, &p);
	if (ret)
		return drop(skb, &p, &t, ret);

	/* Only packets for the endpoint behind this interface are ours. */
	dst = endpoint_lookup4(p.daddr);
	if (!dst || dst->ifindex != skb->ifindex)
		return TC_ACT_OK;
	ret = endpoint_ingress4(skb, &p, &t, dst, 0, 0, cfg);
	if (ret)
		return drop(skb, &p, &t, ret);
	count(CEL_DIR_INGRESS, CEL_REASON_FORWARDED, skb->len);
	return TC_ACT_OK;
}

/* Where a packet for a local endpoint came from (from_node4/6). */
/* Off one of the node's devices: the source's identity is its address's. */
#define CEL_FROM_DEVICE 0
/* Out of the VXLAN device: the VNI's identity; anything not for a local
 * endpoint is the node's stack's, as the device delivered it there. */
#define CEL_FROM_OVERLAY 1
/* Decapsulated by tunnel_decap: the VNI's identity, and nowhere to go but
 * a local endpoint (the one tunnel_decap found). */
#define CEL_FROM_DECAP 2

/* IPv4 that reaches the node for a local endpoint, out of the tunnel or
 * straight off one of the node's devices: its ingress, then straight into
 * the pod, past the node's routing. Out of the tunnel, the source's
 * identity is the one the VNI carries (tunnel_identity: none is an error,
 * and one from a sender or with a VNI no node would send, -CEL_REASON_*,
 * drops the packet wherever it goes); off a device (src_identity 0) it is
 * the source address's, from the ipcache, never host (netdev_identity4).
 * Anything else not for a local endpoint, or that does not parse, is the
 * node's stack's to route or refuse: what it then delivers to a pod meets
 * that pod's cel_to_container. */
static __always_inline int from_node4(struct __sk_buff *skb, const struct datapath_config *cfg,
				      int src_identity, int from)
{
	struct trace t = { .direction = CEL_DIR_INGRESS,
			   .src_identity = src_identity > 0 ? src_identity : 0 };
	int tunnelled = from != CEL_FROM_DEVICE;
	struct dsr_opt4 opt = {};
	struct endpoint_info *dst;
	struct pkt p = {};
	int ret;

	ret = parse_ipv4(skb, &p);
	if (ret)
		return tunnelled ? drop(skb, &p, &t, ret) : TC_ACT_OK;
	/* Not believed: neither a pod nor the node's stack gets it. */
	if (src_identity < 0)
		return drop(skb, &p, &t, -src_identity);
	dst = endpoint_lookup4(p.daddr);
	/* Gone since tunnel_decap looked: the stack must not route a packet
	 * that lost its outer headers and the identity they carried. */
	if (!dst && from == CEL_FROM_DECAP)
		return drop(skb, &p, &t, CEL_REASON_ENCAP_FAILED);
	if (!dst)
		return TC_ACT_OK;
	if (tunnelled && !src_identity)
		return drop(skb, &p, &t, CEL_REASON_ENCAP_FAILED);
	/* A DSR connection's first packet (lib/dsr.h). */
	ret = dsr4_read_opt(skb, &p, cfg, tunnelled, &opt);
	if (ret)
		return drop(skb, &p, &t, ret);
	/* A DSR client from outside, out of the tunnel: its CIDR identity
	 * here, if any (dsr4_vni). */
	if (tunnelled && src_identity == CEL_IDENTITY_WORLD)
		src_identity = dsr4_client_identity(cfg, p.saddr);
	ret = endpoint_ingress4(skb, &p, &t, dst, src_identity, !tunnelled, cfg);
	if (!ret && opt.type)
		ret = dsr4_record(&p, &opt);
	if (ret)
		return drop(skb, &p, &t, ret);
	ret = redirect_to_endpoint(skb, CEL_DIR_INGRESS, dst);
	return ret < 0 ? drop(skb, &p, &t, CEL_REASON_NAT_FAILED) : ret;
}

/* IPv6 for a local endpoint from outside the node: as from_node4 (none is
 * decapsulated by the programs). */
static __always_inline int from_node6(struct __sk_buff *skb, const struct datapath_config *cfg,
				      int src_identity, int from)
{
	struct trace t = { .direction = CEL_DIR_INGRESS,
			   .src_identity = src_identity > 0 ? src_identity : 0 };
	int tunnelled = from != CEL_FROM_DEVICE;
	struct endpoint_info *dst;
	struct pkt6 p = {};
	int ret;

	ret = parse_ipv6(skb, &p);
	if (ret)
		return tunnelled ? drop6(skb, &p, &t, ret) : TC_ACT_OK;
	if (src_identity < 0)
		return drop6(skb, &p, &t, -src_identity);
	dst = endpoint_lookup6(p.daddr);
	if (!dst)
		return TC_ACT_OK;
	if (tunnelled && !src_identity)
		return drop6(skb, &p, &t, CEL_REASON_ENCAP_FAILED);
	ret = endpoint_ingress6(skb, &p, &t, dst, src_identity, !tunnelled, cfg);
	if (ret)
		return drop6(skb, &p, &t, ret);
	ret = redirect_to_endpoint(skb, CEL_DIR_INGRESS, dst);
	return ret < 0 ? drop6(skb, &p, &t, CEL_REASON_NAT_FAILED) : ret;
}

/* The node's own packets routed into the tunnel device (tunnel mode routes
 * other nodes' pod CIDRs there): the tunnel key of the node hosting the
 * destination, with the host identity; no such node, or no key, no packet.
 * Pods' packets come with their key and pass. */
SEC("tc")
int cel_to_overlay(struct __sk_buff *skb)
{
	struct datapath_config *cfg = config_get();
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	int ret = TUNNEL_PASS;

	if (tunnel_has_key(skb))
		return TC_ACT_OK;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + ETH_HLEN;

		if ((void *)(ip + 1) <= data_end)
			ret = tunnel_lookup(cfg, CEL_FAMILY_IPV4, &ip->daddr, CEL_IDENTITY_HOST);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) <= data_end)
			ret = tunnel_lookup(cfg, CEL_FAMILY_IPV6, &ip6->daddr, CEL_IDENTITY_HOST);
	}
	if (ret == 0)
		ret = tunnel_set_key(skb);
	if (ret == 0)
		return TC_ACT_OK;
	/* No node to send it to: the kernel's own link-local chatter on the
	 * device (IPv6 router solicitations, MLD), which no tunnel carries. */
	if (ret > 0)
		count(CEL_DIR_EGRESS, CEL_REASON_ENCAP_FAILED, skb->len);
	return TC_ACT_SHOT;
}

SEC("tc")
int cel_from_overlay(struct __sk_buff *skb)
{
	struct datapath_config *cfg = config_get();
	int src_identity = tunnel_source_identity(skb, cfg);

	if (skb->protocol == bpf_htons(ETH_P_IP))
		return from_node4(skb, cfg, src_identity, CEL_FROM_OVERLAY);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return from_node6(skb, cfg, src_identity, CEL_FROM_OVERLAY);
	/* No frame of a sender the VNI is not believed from goes on (a node
	 * sends no other: cel_to_overlay keys only IP). */
	if (src_identity < 0) {
		count(CEL_DIR_INGRESS, -src_identity, skb->len);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

/* Not a frontend reached from outside: the packet goes on as before. */
#define CEL_NOT_EXTERNAL -1
/* An ICMP error, for nodeport_error4/6. */
#define CEL_NODEPORT_ERROR -2

/* A connection from outside to a frontend without backends: its port
 * unreachable goes back out of the device it came in on. */
/* Not inlined: the refusal is built in a frame of its own, off nodeport4's. */
static __noinline int reject_out4(struct __sk_buff *skb, const struct pkt *p,
				       const struct trace *t)
{
	drop(skb, p, t, CEL_REASON_NO_SERVICE_BACKEND);
	if (reject4_build(skb, p) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

static __always_inline int reject_out6(struct __sk_buff *skb, const struct pkt6 *p,
				       const struct trace *t)
{
	drop6(skb, p, t, CEL_REASON_NO_SERVICE_BACKEND);
	if (reject6_build(skb, p) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/*
 * A reply from another node's backend to a client from outside whose source
 * this node translated (externalTrafficPolicy Cluster): back to the client,
 * reverse-NATed to the frontend, and routed out past the stack. Returns the
 * verdict, or CEL_NOT_EXTERNAL if the packet is no such reply.
 */
/* fib_redirect4 for the IPv4 node-port paths, in a frame of its own: the
 * lookup's parameters would otherwise add to nodeport4's. */
static __noinline int nodeport_fib4(struct __sk_buff *skb, const struct pkt *p)
{
	return fib_redirect4(skb, p);
}

static __always_inline int nodeport_reply4(struct __sk_buff *skb, struct pkt *p,
					   const struct datapath_config *cfg, struct trace *t)
{
	struct ct_entry *ce = NULL;
	struct ct_key key = {};
	__u64 now;
	int ret;

	if (!snat4_reply(p))
		return CEL_NOT_EXTERNAL;
	ret = frag4_track(p);
	if (ret)
		return drop(skb, p, t, ret);
	ret = unsnat4(skb, p);
	if (ret)
		return drop(skb, p, t, ret);
	now = bpf_ktime_get_ns();
	ct_key_from_pkt(&key, p, 0);
	if (ct_lookup4(&key, p, cfg, now, &ce) == CT_REPLY && ce && ce->rev_nat_id) {
		ret = lb4_rev_nat(skb, p, ce->rev_nat_id, cfg, now);
		if (ret)
			return drop(skb, p, t, ret);
	}
	count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, skb->len);
	return nodeport_fib4(skb, p);
}

static __always_inline int nodeport_reply6(struct __sk_buff *skb, struct pkt6 *p,
					   const struct datapath_config *cfg, struct trace *t)
{
	struct ct_entry *ce = NULL;
	struct ct6_key key = {};
	__u64 now;
	int ret;

	if (!snat6_reply(p))
		return CEL_NOT_EXTERNAL;
	ret = frag6_track(p);
	if (ret)
		return drop6(skb, p, t, ret);
	ret = unsnat6(skb, p);
	if (ret)
		return drop6(skb, p, t, ret);
	now = bpf_ktime_get_ns();
	ct6_key_from_pkt(&key, p, 0);
	if (ct_lookup6(&key, p, cfg, now, &ce) == CT_REPLY && ce && ce->rev_nat_id) {
		ret = lb6_rev_nat(skb, p, ce->rev_nat_id, cfg, now);
		if (ret)
			return drop6(skb, p, t, ret);
	}
	count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, skb->len);
	return fib_redirect6(skb, p);
}

/* A DSR connection's packet for another node's backend, in tunnel routing:
 * into the tunnel with the client's identity (lib/dsr.h); a backend no node
 * of the tunnel hosts is routed to. In a frame of its own, as
 * nodeport_fib4. */
static __noinline int nodeport_tunnel4(struct __sk_buff *skb, const struct datapath_config *cfg,
				       const struct pkt *p, const struct trace *t)
{
	__u32 len = skb->len;
	int ret;

	ret = tunnel_lookup(cfg, CEL_FAMILY_IPV4, &p->daddr, dsr4_vni(t->src_identity));
	if (ret > 0)
		return drop(skb, p, t, ret);
	if (ret == TUNNEL_PASS) {
		count(CEL_DIR_INGRESS, CEL_REASON_FORWARDED, len);
		return fib_redirect4(skb, p);
	}
	ret = tunnel_send(skb, cfg);
	if (ret < 0)
		return drop(skb, p, t, -ret);
	count(CEL_DIR_INGRESS, CEL_REASON_FORWARDED, len);
	return ret;
}

/*
 * IPv4 from outside for a frontend reached from outside (lib/nodeport.h):
 * translated to its backend as a pod's packet would be, a local backend's
 * ingress policy decided on the client's identity (whatever the source
 * translation; another node's backend is judged by its node, on the source
 * it receives: this node's, remote-node, unless the frontend's policy is
 * Local), the connection and its backend recorded, then, unless the
 * frontend's policy is Local, the source translated to the frontend's
 * address. A local backend gets it straight; another node's is routed to.
 * Returns the verdict, or CEL_NOT_EXTERNAL.
 */
/*
 * The node-port paths are BPF subprograms (not inlined), as are
 * netdev_to_pod4/6, nodeport_fib4 and reject_out4: inlined together into
 * cel_from_netdev, with the maglev and affinity choice, they would pass the
 * 512-byte stack of one function. The verifier adds up the frames of a call
 * chain, so the deepest (cel_from_netdev, nodeport4, nodeport_fib4) stays
 * within 512 bytes too.
 */
static __noinline int nodeport4(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	struct trace t = { .direction = CEL_DIR_INGRESS };
	struct scratch6 *s = scratch4();
	struct endpoint_info *dst;
	struct ct_entry *ce = NULL;
	struct lb4_service *svc;
	struct lb4_choice *lb;
	struct ct_key *key;
	struct pkt *p;
	__be16 frontend_port;
	__be32 frontend;
	__u8 flags;
	__u64 now;
	int ret, ct;

	if (!s)
		return CEL_NOT_EXTERNAL;
	p = &s->p4;
	key = &s->key4;
	lb = &s->lb4;
	if (parse_ipv4(skb, p))
		return CEL_NOT_EXTERNAL;
	/* A later fragment takes the ports its first recorded here (below, or
	 * in nodeport_reply4); one whose first was not seen here is not ours. */
	if (p->frag == CEL_FRAG_LATER && frag4_track(p))
		return CEL_NOT_EXTERNAL;
	if (icmp4_is_error(p))
		return CEL_NODEPORT_ERROR;
	ret = nodeport_reply4(skb, p, cfg, &t);
	if (ret != CEL_NOT_EXTERNAL)
		return ret;
	svc = lb4_external(p);
	if (!svc)
		return CEL_NOT_EXTERNAL;
	ret = frag4_track(p);
	if (ret)
		return drop(skb, p, &t, ret);
	flags = svc->flags;
	frontend = p->daddr;
	frontend_port = p->dport;
	t.src_identity = netdev_identity4(cfg, p->saddr);
	now = bpf_ktime_get_ns();
	ret = lb4_dnat(skb, p, cfg, now, lb);
	if (ret == CEL_REASON_NO_SERVICE_BACKEND && service_reject(cfg))
		return reject_out4(skb, p, &t);
	if (ret)
		return drop(skb, p, &t, ret);

	dst = endpoint_lookup4(p->daddr);
	ct_key_from_pkt(key, p, 0);
	ct = ct_lookup4(key, p, cfg, now, &ce);
	if (ct_unchecked(ct, ce, dst)) {
		ret = ct_recheck4(skb, p, &t, ct, ce, dst, t.src_identity, cfg);
		if (ret)
			return drop(skb, p, &t, ret);
	}
	if (ct == CT_NEW) {
		__u8 im = CEL_MATCH_NONE;

		if (dst) {
			t.endpoint_id = dst->id;
			t.dst_identity = dst->identity;
			ret = policy_check(skb, p, &t, dst, CEL_DIR_INGRESS, t.src_identity, cfg,
					   &im);
			if (ret)
				return drop(skb, p, &t, ret);
		}
		ret = ct_create4_flags(key, p, cfg, now, lb->rev_nat_id, lb->backend_id,
				       (dst ? CEL_CT_F_DST_LOCAL : 0) | ct_src_local4(p));
		if (ret)
			return drop(skb, p, &t, ret);
		if (trace_events(cfg))
			trace_new(skb, p, &t, im << 4, lb->rev_nat_id);
	}
	ret = lb4_commit(lb, p, cfg, now);
	if (ret)
		return drop(skb, p, &t, ret);
	/* DSR: the client keeps its source; another node's backend learns
	 * the frontend from the connection's first packet (lib/dsr.h). Only
	 * for a frontend at the node's own address, the one other nodes
	 * believe the option from; an external or ingress IP keeps SNAT. */
	if (dsr4_mode(cfg, p) && ipcache_identity4(cfg, frontend) == CEL_IDENTITY_HOST) {
		if (!dst && dsr4_wanted(cfg, p)) {
			ret = dsr4_add_opt(skb, p, frontend, frontend_port);
			if (ret)
				return drop(skb, p, &t, ret);
		}
		if (!dst && cfg->tunnel_ifindex)
			return nodeport_tunnel4(skb, cfg, p, &t);
	} else if (!(flags & CEL_SVC_F_LOCAL)) {
		ret = snat4(skb, p, frontend, 1);
		if (ret)
			return drop(skb, p, &t, ret);
	}
	if (dst) {
		ret = redirect_to_endpoint(skb, CEL_DIR_INGRESS, dst);
		return ret < 0 ? drop(skb, p, &t, CEL_REASON_NAT_FAILED) : ret;
	}
	count(CEL_DIR_INGRESS, CEL_REASON_FORWARDED, skb->len);
	return nodeport_fib4(skb, p);
}

/* nodeport4 for IPv6 (a subprogram, as nodeport4). */
static __noinline int nodeport6(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	struct trace t = { .direction = CEL_DIR_INGRESS };
	struct lb6_choice *lb;
	struct endpoint_info *dst;
	struct ct_entry *ce = NULL;
	struct scratch6 *s = scratch6();
	struct lb4_service *svc;
	struct ct6_key *key;
	struct pkt6 *p;
	__u8 frontend[16];
	__u8 flags;
	__u64 now;
	int ret, ct;

	if (!s)
		return CEL_NOT_EXTERNAL;
	p = &s->p;
	key = &s->key;
	lb = &s->lb6;
	if (parse_ipv6(skb, p))
		return CEL_NOT_EXTERNAL;
	/* A later fragment takes the ports its first recorded here (below, or
	 * in nodeport_reply6); one whose first was not seen here is not ours. */
	if (p->frag == CEL_FRAG_LATER && frag6_track(p))
		return CEL_NOT_EXTERNAL;
	if (icmp6_is_error(p))
		return CEL_NODEPORT_ERROR;
	ret = nodeport_reply6(skb, p, cfg, &t);
	if (ret != CEL_NOT_EXTERNAL)
		return ret;
	svc = lb6_external(p);
	if (!svc)
		return CEL_NOT_EXTERNAL;
	ret = frag6_track(p);
	if (ret)
		return drop6(skb, p, &t, ret);
	flags = svc->flags;
	__builtin_memcpy(frontend, p->daddr, 16);
	t.src_identity = netdev_identity6(cfg, p->saddr);
	now = bpf_ktime_get_ns();
	ret = lb6_dnat(skb, p, cfg, now, lb);
	if (ret == CEL_REASON_NO_SERVICE_BACKEND && service_reject(cfg))
		return reject_out6(skb, p, &t);
	if (ret)
		return drop6(skb, p, &t, ret);

	dst = endpoint_lookup6(p->daddr);
	ct6_key_from_pkt(key, p, 0);
	ct = ct_lookup6(key, p, cfg, now, &ce);
	if (ct_unchecked(ct, ce, dst)) {
		ret = ct_recheck6(skb, p, &t, ct, ce, dst, t.src_identity, cfg);
		if (ret)
			return drop6(skb, p, &t, ret);
	}
	if (ct == CT_NEW) {
		__u8 im = CEL_MATCH_NONE;

		if (dst) {
			t.endpoint_id = dst->id;
			t.dst_identity = dst->identity;
			ret = policy_check6(skb, p, &t, dst, CEL_DIR_INGRESS, t.src_identity, cfg,
					    &im);
			if (ret)
				return drop6(skb, p, &t, ret);
		}
		ret = ct_create6_flags(key, p, cfg, now, lb->rev_nat_id, lb->backend_id,
				       (dst ? CEL_CT_F_DST_LOCAL : 0) | ct_src_local6(p));
		if (ret)
			return drop6(skb, p, &t, ret);
		if (trace_events(cfg))
			trace_new6(skb, p, &t, im << 4, lb->rev_nat_id);
	}
	ret = lb6_commit(lb, p, cfg, now);
	if (ret)
		return drop6(skb, p, &t, ret);
	if (!(flags & CEL_SVC_F_LOCAL)) {
		ret = snat6(skb, p, frontend, 1);
		if (ret)
			return drop6(skb, p, &t, ret);
	}
	if (dst) {
		ret = redirect_to_endpoint(skb, CEL_DIR_INGRESS, dst);
		return ret < 0 ? drop6(skb, p, &t, CEL_REASON_NAT_FAILED) : ret;
	}
	count(CEL_DIR_INGRESS, CEL_REASON_FORWARDED, skb->len);
	return fib_redirect6(skb, p);
}

/*
 * An error from another node's backend (or a router on its way) about a
 * connection of a client from outside whose source this node translated:
 * back to that client, from the frontend (lib/related.h), routed out past
 * the stack. Anything else: CEL_NOT_EXTERNAL. Subprograms of their own, off
 * nodeport4/6's frames: the verifier adds up a call chain's frames.
 */
static __noinline int nodeport_error4(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	struct trace t = { .direction = CEL_DIR_EGRESS };
	struct pkt p = {};
	int ret;

	if (parse_ipv4(skb, &p))
		return CEL_NOT_EXTERNAL;
	ret = icmp4_related(skb, &p, 1, 0);
	if (ret == CEL_RELATED_NONE)
		return CEL_NOT_EXTERNAL;
	if (ret > 0)
		return drop(skb, &p, &t, ret);
	count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, skb->len);
	return nodeport_fib4(skb, &p);
}

static __noinline int nodeport_error6(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	struct trace t = { .direction = CEL_DIR_EGRESS };
	struct scratch6 *s = scratch6();
	int ret;

	if (!s || parse_ipv6(skb, &s->p))
		return CEL_NOT_EXTERNAL;
	ret = icmp6_related(skb, &s->p, 1, 0);
	if (ret == CEL_RELATED_NONE)
		return CEL_NOT_EXTERNAL;
	if (ret > 0)
		return drop6(skb, &s->p, &t, ret);
	count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, skb->len);
	return fib_redirect6(skb, &s->p);
}

/* from_node4/6 for cel_from_netdev, in frames of their own: inlined there,
 * their stack would add to that of the frame calling nodeport4/6. */
static __noinline int netdev_to_pod4(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	return from_node4(skb, cfg, 0, CEL_FROM_DEVICE);
}

static __noinline int netdev_to_pod6(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	return from_node6(skb, cfg, 0, CEL_FROM_DEVICE);
}

/* The tunnel's own packets at the node's device: those tunnel_decap takes
 * go straight into their pod with the identity their VNI carries, those it
 * does not believe (-CEL_REASON_*) are dropped as they came; the rest go on
 * to the VXLAN device. */
static __noinline int tunnel_receive(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	int id = tunnel_decap(skb, cfg);

	return id == TUNNEL_PASS ? TC_ACT_OK : from_node4(skb, cfg, id, CEL_FROM_DECAP);
}

/* The ingress of the node's own devices (those holding its addresses):
 * frontends reached from outside are translated (nodeport4/6); packets
 * from other nodes, or from beyond, for a local pod go straight into it
 * with the source's identity from the ipcache, as those out of the tunnel
 * do. Only frames addressed to this host: a device that sees other hosts'
 * frames (promiscuous) must not have them delivered. */
SEC("tc")
int cel_from_netdev(struct __sk_buff *skb)
{
	struct datapath_config *cfg = config_get();
	int ret;

	if (skb->pkt_type != PACKET_HOST)
		return TC_ACT_OK;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (tunnel_own_packet4(skb, cfg))
			return tunnel_receive(skb, cfg);
		ret = nodeport4(skb, cfg);
		if (ret == CEL_NODEPORT_ERROR)
			ret = nodeport_error4(skb, cfg);
		return ret != CEL_NOT_EXTERNAL ? ret : netdev_to_pod4(skb, cfg);
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		ret = nodeport6(skb, cfg);
		if (ret == CEL_NODEPORT_ERROR)
			ret = nodeport_error6(skb, cfg);
		return ret != CEL_NOT_EXTERNAL ? ret : netdev_to_pod6(skb, cfg);
	}
	return TC_ACT_OK;
}

/* Socket-level load balancing of the node's own sockets (lib/sock.h). */
SEC("cgroup/connect4")
int cel_sock4_connect(struct bpf_sock_addr *ctx)
{
	return sock4_translate(ctx, 0);
}

SEC("cgroup/sendmsg4")
int cel_sock4_sendmsg(struct bpf_sock_addr *ctx)
{
	return sock4_translate(ctx, 1);
}

SEC("cgroup/recvmsg4")
int cel_sock4_recvmsg(struct bpf_sock_addr *ctx)
{
	return sock4_reverse(ctx);
}

SEC("cgroup/getpeername4")
int cel_sock4_getpeername(struct bpf_sock_addr *ctx)
{
	return sock4_reverse(ctx);
}

SEC("cgroup/connect6")
int cel_sock6_connect(struct bpf_sock_addr *ctx)
{
	return sock6_translate(ctx, 0);
}

SEC("cgroup/sendmsg6")
int cel_sock6_sendmsg(struct bpf_sock_addr *ctx)
{
	return sock6_translate(ctx, 1);
}

SEC("cgroup/recvmsg6")
int cel_sock6_recvmsg(struct bpf_sock_addr *ctx)
{
	return sock6_reverse(ctx);
}

SEC("cgroup/getpeername6")
int cel_sock6_getpeername(struct bpf_sock_addr *ctx)
{
	return sock6_reverse(ctx);
}
