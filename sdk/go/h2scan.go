package sluice

// clientPreface opens every HTTP/2 connection from its client (RFC 9113 §3.4), here Sluice.
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// frameHeaderLen is the length of an HTTP/2 frame header; frameHeaders is the type of a
// HEADERS frame, which opens a request's stream.
const (
	frameHeaderLen = 9
	frameHeaders   = 0x1
)

// h2Scan follows the frames Sluice sends on an HTTP/2 session, without decoding them, to
// tell when the first request arrives: the preface and SETTINGS come right after the 101, so
// bytes alone do not mean the session served anything (see sessionConn.served).
type h2Scan struct {
	preface int                  // preface bytes seen
	head    [frameHeaderLen]byte // the frame header being read
	got     int                  // bytes of head read
	skip    int                  // payload bytes of the current frame still to pass
}

// request feeds bytes read from the session and reports whether a HEADERS frame began in
// them (or earlier: once true it stays true for the caller to remember).
func (s *h2Scan) request(p []byte) bool {
	for len(p) > 0 {
		switch {
		case s.preface < len(clientPreface):
			n := min(len(p), len(clientPreface)-s.preface)
			s.preface += n
			p = p[n:]
		case s.skip > 0:
			n := min(len(p), s.skip)
			s.skip -= n
			p = p[n:]
		default:
			n := copy(s.head[s.got:], p)
			s.got += n
			p = p[n:]
			if s.got > 3 && s.head[3] == frameHeaders {
				return true // its type is known: the rest of the header does not matter
			}
			if s.got < frameHeaderLen {
				continue
			}
			s.got = 0
			s.skip = int(s.head[0])<<16 | int(s.head[1])<<8 | int(s.head[2])
		}
	}
	return false
}
