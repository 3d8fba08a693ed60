/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Metrics and events: every packet the programs decide on is counted once
 * under (direction, reason); drops and, when enabled, policy verdicts are
 * also reported through the ring buffer.
 */
#ifndef CELLIUM_LIB_NOTIFY_H
#define CELLIUM_LIB_NOTIFY_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "ipv6.h"
#include "maps.h"
#include "packet.h"

/* Who a verdict is about: filled in as the program learns it. */
struct trace {
	__u32 src_identity;
	__u32 dst_identity;
	__u16 endpoint_id;
	__u8 direction;
	__u8 match;       /* CEL_MATCH_*, set for verdicts and traces */
	__u16 rev_nat_id; /* set for traces of translated connections */
};

static __always_inline void count(__u8 direction, __u8 reason, __u32 len)
{
	__u32 key = (__u32)direction * CEL_REASON_SLOTS + reason;
	struct metrics_value *v = bpf_map_lookup_elem(&cel_metrics, &key);

	/* Per-CPU values: no other CPU writes this slot. */
	if (v) {
		v->packets += 1;
		v->bytes += len;
	}
}

/*
 * Reserves an event and fills what every event says; the caller adds the
 * addresses and ports and submits. NULL when the ring buffer is full: a
 * full buffer loses the event, never the packet's verdict.
 */
static __always_inline struct event *event_start(struct __sk_buff *skb, const struct trace *t,
						 __u8 type, __u8 reason, __u8 verdict)
{
	struct event *e = bpf_ringbuf_reserve(&cel_events, sizeof(*e), 0);

	if (!e) {
		/* Counted where no reader can miss it. */
		count(CEL_DIR_INGRESS, CEL_REASON_EVENTS_LOST, 0);
		return NULL;
	}
	/* Reserved memory holds whatever was there before: nothing of it
	 * may reach a reader. */
	__builtin_memset(e, 0, sizeof(*e));
	e->ktime = bpf_ktime_get_ns();
	e->type = type;
	e->reason = reason;
	e->direction = t->direction;
	e->endpoint_id = t->endpoint_id;
	e->src_identity = t->src_identity;
	e->dst_identity = t->dst_identity;
	/* An opaque copy of the context: the compiler must load the field
	 * through it, never keep a pointer into the context it computed
	 * for one of the many inlined copies (the verifier refuses loads
	 * through a context pointer with an offset). */
	asm volatile("" : "+r"(skb));
	e->ifindex = skb->ifindex;
	e->verdict = verdict;
	e->match = t->match;
	e->rev_nat_id = t->rev_nat_id;
	return e;
}

static __always_inline void emit_event(struct __sk_buff *skb, const struct pkt *p,
				       const struct trace *t, __u8 type, __u8 reason,
				       __u8 verdict)
{
	struct event *e = event_start(skb, t, type, reason, verdict);

	if (!e)
		return;
	e->family = CEL_FAMILY_IPV4;
	e->protocol = p->protocol;
	e->tcp_flags = p->tcp_flags;
	e->icmp_type = p->icmp_type;
	e->icmp_code = p->icmp_code;
	__builtin_memcpy(e->saddr, &p->saddr, 4);
	__builtin_memcpy(e->daddr, &p->daddr, 4);
	e->sport = p->sport;
	e->dport = p->dport;
	e->len = p->len;
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int drop(struct __sk_buff *skb, const struct pkt *p,
				const struct trace *t, __u8 reason)
{
	count(t->direction, reason, skb->len);
	emit_event(skb, p, t, CEL_EVENT_DROP, reason, CEL_VERDICT_DENIED);
	return TC_ACT_SHOT;
}

static __always_inline void emit_event6(struct __sk_buff *skb, const struct pkt6 *p,
					const struct trace *t, __u8 type, __u8 reason,
					__u8 verdict)
{
	struct event *e = event_start(skb, t, type, reason, verdict);

	if (!e)
		return;
	e->family = CEL_FAMILY_IPV6;
	e->protocol = p->protocol;
	e->tcp_flags = p->tcp_flags;
	e->icmp_type = p->icmp_type;
	e->icmp_code = p->icmp_code;
	__builtin_memcpy(e->saddr, p->saddr, 16);
	__builtin_memcpy(e->daddr, p->daddr, 16);
	e->sport = p->sport;
	e->dport = p->dport;
	e->len = p->len;
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int drop6(struct __sk_buff *skb, const struct pkt6 *p,
				 const struct trace *t, __u8 reason)
{
	count(t->direction, reason, skb->len);
	emit_event6(skb, p, t, CEL_EVENT_DROP, reason, CEL_VERDICT_DENIED);
	return TC_ACT_SHOT;
}

static __always_inline int trace_events(const struct datapath_config *cfg)
{
	return cfg && (cfg->flags & CEL_CFG_F_TRACE_EVENTS);
}

/* A new connection forwarded: `match` as event.match describes it,
 * `rev_nat_id` the frontend it was translated through (0: none). */
static __always_inline void trace_new(struct __sk_buff *skb, const struct pkt *p,
				      const struct trace *t, __u8 match, __u16 rev_nat_id)
{
	struct trace tt = *t;

	tt.match = match;
	tt.rev_nat_id = rev_nat_id;
	emit_event(skb, p, &tt, CEL_EVENT_TRACE, CEL_REASON_FORWARDED, CEL_VERDICT_ALLOWED);
}

static __always_inline void trace_new6(struct __sk_buff *skb, const struct pkt6 *p,
				       const struct trace *t, __u8 match, __u16 rev_nat_id)
{
	struct trace tt = *t;

	tt.match = match;
	tt.rev_nat_id = rev_nat_id;
	emit_event6(skb, p, &tt, CEL_EVENT_TRACE, CEL_REASON_FORWARDED, CEL_VERDICT_ALLOWED);
}

#endif /* CELLIUM_LIB_NOTIFY_H */
