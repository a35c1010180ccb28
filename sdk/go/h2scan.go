package sluice

import "encoding/binary"

// clientPreface opens every HTTP/2 connection from its client (RFC 9113 §3.4), here Sluice.
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// HTTP/2 frame layout and the frame types and flag that open and close streams (RFC 9113 §4.1,
// §6).
const (
	frameHeaderLen  = 9
	frameData       = 0x0
	frameHeaders    = 0x1
	frameRSTStream  = 0x3
	flagEndStream   = 0x1
	streamIDMask    = 1<<31 - 1
	maxFramePayload = 1<<24 - 1
)

// frameScan follows the frames in one direction of an HTTP/2 session without decoding them:
// it reports each frame's type, flags and stream as its header completes, and skips payloads.
type frameScan struct {
	preface int                  // bytes of the client preface still to pass (Sluice's side)
	head    [frameHeaderLen]byte // the frame header being read
	got     int                  // bytes of head read
	skip    int                  // payload bytes of the current frame still to pass
}

func (s *frameScan) scan(p []byte, frame func(typ, flags byte, stream uint32)) {
	for len(p) > 0 {
		switch {
		case s.preface > 0:
			n := min(len(p), s.preface)
			s.preface -= n
			p = p[n:]
		case s.skip > 0:
			n := min(len(p), s.skip)
			s.skip -= n
			p = p[n:]
		default:
			n := copy(s.head[s.got:], p)
			s.got += n
			p = p[n:]
			if s.got < frameHeaderLen {
				continue
			}
			s.got = 0
			s.skip = int(s.head[0])<<16 | int(s.head[1])<<8 | int(s.head[2])
			frame(s.head[3], s.head[4], binary.BigEndian.Uint32(s.head[5:])&streamIDMask)
		}
	}
}

// h2Streams knows which requests of an HTTP/2 session are open, from the frames both ways:
// Sluice's HEADERS open a stream, the service's END_STREAM (on DATA or trailers) or either
// side's RST_STREAM close it. A session with none open has nothing in flight, neither in a
// handler nor in the connection's buffers; closing it then loses nothing. The bytes Sluice
// sends right after the 101 (the preface, SETTINGS, WINDOW_UPDATE) open nothing.
type h2Streams struct {
	in, out frameScan
	open    map[uint32]struct{}
	// requested: a request arrived on the session (it served).
	requested bool
}

func newH2Streams() *h2Streams {
	return &h2Streams{in: frameScan{preface: len(clientPreface)}, open: make(map[uint32]struct{})}
}

// read follows bytes Sluice sent.
func (h *h2Streams) read(p []byte) {
	h.in.scan(p, func(typ, _ byte, stream uint32) {
		switch {
		case typ == frameHeaders && stream != 0:
			h.open[stream] = struct{}{} // a request, or its trailers: open either way
			h.requested = true
		case typ == frameRSTStream:
			delete(h.open, stream)
		}
	})
}

// wrote follows bytes the service's server wrote.
func (h *h2Streams) wrote(p []byte) {
	h.out.scan(p, func(typ, flags byte, stream uint32) {
		switch {
		case (typ == frameData || typ == frameHeaders) && flags&flagEndStream != 0,
			typ == frameRSTStream:
			delete(h.open, stream)
		}
	})
}
