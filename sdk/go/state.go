package sluice

// counts is the bookkeeping behind resizing, as in the Rust SDK. A slot is a goroutine that
// keeps one session registered, re-dialing when it ends. SetCapacity sets a target; growing
// starts slots, shrinking owes retirements: the next slot to reach a decision point (a
// response to send, a dial to start, a backoff to wait) claims one and ends. slots-retire is
// the capacity the slots settle at.
type counts struct {
	// target is the capacity asked for.
	target int
	// slots counts live slots that have not claimed a retirement.
	slots int
	// retire counts retirements owed by surplus slots.
	retire int
	// stopping: Shutdown or Close began; no slot dials again.
	stopping bool
}

// resize sets the target and returns how many slots to start.
func (c *counts) resize(target int) int {
	c.target = target
	live := c.slots - c.retire
	if target <= live {
		c.retire += live - target
		return 0
	}
	cancelled := min(target-live, c.retire)
	c.retire -= cancelled
	spawn := target - live - cancelled
	c.slots += spawn
	return spawn
}

// claimRetirement takes one owed retirement for the calling slot, if any.
func (c *counts) claimRetirement() bool {
	if c.retire == 0 {
		return false
	}
	c.retire--
	c.slots--
	return true
}

// slotFailed: a slot gave up for good; it settles an owed retirement when there is one.
func (c *counts) slotFailed() {
	c.retire = max(c.retire-1, 0)
	c.slots--
}
