package sandbox

import (
	"errors"
	"io"
)

// ErrStreamTruncated is returned (wrapped) by a stream that ended before its last event (an
// exec's exit, a run's result): the connection broke or the server went away midway.
var ErrStreamTruncated = errors.New("koder-sandbox: stream ended before its last event")

// eventStream is what ExecStream and RunStream share: events decoded from a Server-Sent
// Events body (or replayed from a JSON answer), read up to the one that ends the stream.
type eventStream[E any] struct {
	body   io.ReadCloser // nil once closed, and for a replayed answer
	sse    *sseReader
	queue  []E
	cur    E
	err    error
	done   bool
	ended  bool // the last event was delivered
	decode func(sseEvent) (ev E, known bool, err error)
	last   func(E) bool
}

func (s *eventStream[E]) next() bool {
	if s.done {
		return false
	}
	ev, err := s.read()
	if err != nil {
		s.err = err
		s.done = true
		s.closeBody()
		return false
	}
	s.cur = ev
	if s.last(ev) {
		s.done, s.ended = true, true
		s.closeBody()
	}
	return true
}

func (s *eventStream[E]) read() (E, error) {
	var none E
	if s.sse == nil {
		if len(s.queue) == 0 {
			return none, ErrStreamTruncated
		}
		ev := s.queue[0]
		s.queue = s.queue[1:]
		return ev, nil
	}
	for {
		raw, err := s.sse.next()
		if err == io.EOF {
			return none, ErrStreamTruncated
		}
		if err != nil {
			return none, err
		}
		ev, known, err := s.decode(raw)
		if err != nil {
			return none, err
		}
		// Event types added by later servers are skipped.
		if known {
			return ev, nil
		}
	}
}

func (s *eventStream[E]) close() error {
	s.done = true
	return s.closeBody()
}

func (s *eventStream[E]) closeBody() error {
	if s.body == nil {
		return nil
	}
	err := s.body.Close()
	s.body = nil
	return err
}
