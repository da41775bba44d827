package dns

import (
	"sync"
	"time"
)

// limiter is a token bucket per sandbox. Buckets idle long enough to have refilled are dropped,
// since a fresh bucket is the same; so sandboxes that went away cost nothing after a while, without
// a goroutine to sweep them.
type limiter struct {
	rate  float64 // tokens per second
	burst float64
	// full is how long an empty bucket takes to refill; sweepEvery is at least that.
	full, sweepEvery time.Duration

	mu sync.Mutex
	// buckets holds the sandboxes' buckets by ID. Protected by mu.
	buckets map[string]bucket
	// swept is when buckets were last swept. Protected by mu.
	swept time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newLimiter(rate float64, burst int) *limiter {
	// Capped so that a tiny rate cannot overflow a Duration.
	full := time.Duration(min(float64(burst)/rate, 365*24*3600) * float64(time.Second))
	return &limiter{
		rate:       rate,
		burst:      float64(burst),
		full:       full,
		sweepEvery: max(full, time.Minute),
		buckets:    make(map[string]bucket),
	}
}

// allow takes a token from id's bucket at now and reports whether there was one.
func (l *limiter) allow(id string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) >= l.sweepEvery {
		l.sweepLocked(now)
	}
	b, ok := l.buckets[id]
	if !ok {
		b = bucket{tokens: l.burst, last: now}
	}
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(l.burst, b.tokens+d.Seconds()*l.rate)
		b.last = now
	}
	allowed := b.tokens >= 1
	if allowed {
		b.tokens--
	}
	l.buckets[id] = b
	return allowed
}

// sweepLocked drops the buckets that have refilled by now.
// Preconditions: l.mu is held.
func (l *limiter) sweepLocked(now time.Time) {
	for id, b := range l.buckets {
		if now.Sub(b.last) >= l.full {
			delete(l.buckets, id)
		}
	}
	l.swept = now
}
