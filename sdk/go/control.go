package sluice

import (
	"bufio"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The control link's lines (protocol/README.md "The control link"): ASCII, one `\n` at the
// end, at most maxControlLine bytes, words separated by one space, numbers decimal without
// sign or leading zeros. crates/sluice-session/src/control.rs is the reference.

const (
	maxControlLine = 128
	// controlSilence: a link silent this long (three missed heartbeats) is lost.
	controlSilence = 3 * time.Second
)

// demand is one slice's demand at one node, all instances together.
type demand struct {
	inFlight, queued, refused, sessions uint64
}

// sample is what the service smooths: in flight, queued and refused together.
func (d demand) sample() float64 {
	return float64(d.inFlight) + float64(d.queued) + float64(d.refused)
}

// nodeLine is a line from a node: DEMAND, DRAINING or FLOOR.
type nodeLine struct {
	verb   string // verbDemand, verbDraining or verbFloor
	demand demand // DEMAND's counts
	floor  bool   // FLOOR 1: the node counts on this instance for its floor of one session
}

const (
	verbDemand   = "DEMAND"
	verbDraining = "DRAINING"
	verbFloor    = "FLOOR"
)

// errInvalidLine: a line that is not one of the protocol's; the link closes.
var errInvalidLine = errors.New("invalid control line")

// parseNodeLine reads one line from a node, without its `\n`.
func parseNodeLine(line string) (nodeLine, error) {
	words, err := lineWords(line)
	if err != nil {
		return nodeLine{}, err
	}
	switch {
	case len(words) == 1 && words[0] == verbDraining:
		return nodeLine{verb: verbDraining}, nil
	case len(words) == 2 && words[0] == verbFloor && (words[1] == "0" || words[1] == "1"):
		return nodeLine{verb: verbFloor, floor: words[1] == "1"}, nil
	case len(words) == 5 && words[0] == verbDemand:
		var n [4]uint64
		for i, w := range words[1:] {
			if n[i], err = lineNumber(w); err != nil {
				return nodeLine{}, invalidLine(line)
			}
		}
		return nodeLine{verb: verbDemand, demand: demand{n[0], n[1], n[2], n[3]}}, nil
	}
	return nodeLine{}, invalidLine(line)
}

// retireLine and capacityLine are the service's lines, with their `\n`.
func retireLine(n int) string   { return "RETIRE " + strconv.Itoa(n) + "\n" }
func capacityLine(n int) string { return "CAPACITY " + strconv.Itoa(n) + "\n" }

func invalidLine(line string) error {
	if len(line) > maxControlLine {
		line = line[:maxControlLine]
	}
	return fmt.Errorf("%w %q", errInvalidLine, line)
}

// lineWords splits a line into its words: printable ASCII within the length limit, separated
// by single spaces.
func lineWords(line string) ([]string, error) {
	if line == "" || len(line) > maxControlLine {
		return nil, invalidLine(line)
	}
	for i := 0; i < len(line); i++ {
		if c := line[i]; c < ' ' || c > '~' {
			return nil, invalidLine(line)
		}
	}
	words := strings.Split(line, " ")
	for _, w := range words {
		if w == "" {
			return nil, invalidLine(line)
		}
	}
	return words, nil
}

// lineNumber is a decimal count: digits only, no leading zero (but 0 itself), fits 64 bits.
func lineNumber(word string) (uint64, error) {
	if strings.TrimLeft(word, "0123456789") != "" || (len(word) > 1 && word[0] == '0') {
		return 0, errInvalidLine
	}
	return strconv.ParseUint(word, 10, 64)
}

// readControlLine reads the next line, without its `\n`; a line longer than the limit is
// invalid. br must buffer at least maxControlLine+1 bytes.
func readControlLine(br *bufio.Reader) (string, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull) || len(line) > maxControlLine+1:
		return "", invalidLine(string(line))
	case err != nil:
		return "", err
	}
	return string(line[:len(line)-1]), nil
}
