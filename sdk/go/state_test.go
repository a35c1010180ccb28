package sluice

import (
	"errors"
	"testing"
	"time"
)

func TestShrinkingOwesRetirementsThatGrowingCancelsFirst(t *testing.T) {
	t.Parallel()
	var c counts
	if spawn := c.resize(4); spawn != 4 {
		t.Fatalf("spawn %d", spawn)
	}
	if spawn := c.resize(2); spawn != 0 || c.slots != 4 || c.retire != 2 {
		t.Fatalf("after shrink: spawn %d, %+v", spawn, c)
	}
	if !c.claimRetirement() {
		t.Fatal("no retirement to claim")
	}
	if spawn := c.resize(5); spawn != 2 || c.slots != 5 || c.retire != 0 || c.target != 5 {
		t.Fatalf("after grow: spawn %d, %+v", spawn, c)
	}
	if c.claimRetirement() {
		t.Fatal("claimed a retirement that is not owed")
	}
}

func TestAFailedSlotSettlesAnOwedRetirement(t *testing.T) {
	t.Parallel()
	var c counts
	c.resize(3)
	c.resize(2)
	c.slotFailed()
	if c.slots != 2 || c.retire != 0 {
		t.Fatalf("%+v", c)
	}
	c.slotFailed()
	if c.slots != 1 || c.retire != 0 {
		t.Fatalf("%+v", c)
	}
	if spawn := c.resize(3); spawn != 2 {
		t.Fatalf("setting the capacity again restarts failed slots: spawn %d", spawn)
	}
}

func TestBackoffDoublesUpToMaxAndJitterOnlyShortens(t *testing.T) {
	t.Parallel()
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5}
	for _, tc := range []struct {
		attempt int
		base    time.Duration
	}{{0, 100}, {1, 200}, {3, 800}, {4, 1000}, {40, 1000}, {1000, 1000}} {
		base := tc.base * time.Millisecond
		for range 50 {
			if d := b.Delay(tc.attempt); d > base || d < base/2 {
				t.Fatalf("attempt %d: %v not within [%v, %v]", tc.attempt, d, base/2, base)
			}
		}
	}
	if d := (Backoff{Initial: time.Millisecond, Max: time.Second, Jitter: -1}).Delay(2); d != 4*time.Millisecond {
		t.Errorf("a negative jitter means none: %v", d)
	}
	if d := (Backoff{}).Delay(0); d > 100*time.Millisecond || d < 50*time.Millisecond {
		t.Errorf("the default first delay is 100 ms less up to half: %v", d)
	}
}

func asError(err error, target **Error) bool { return errors.As(err, target) }
