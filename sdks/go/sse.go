package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// ErrEventTooLarge is returned (wrapped) by a stream whose event exceeds the client's bound
// (WithMaxEventBytes).
var ErrEventTooLarge = errors.New("koder-sandbox: stream event larger than the client's limit")

// sseEvent is one dispatched Server-Sent Event.
type sseEvent struct {
	name string
	data []byte
}

// sseReader parses the text/event-stream format (lines ending in LF or CRLF; `event:` and
// `data:` fields; comments and other fields ignored) with every line and event bounded.
type sseReader struct {
	r   *bufio.Reader
	max int
}

func newSSEReader(r io.Reader, max int) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// next returns the next event, or io.EOF once the stream ends; an event cut off by the end
// of the stream is dropped, as the format requires.
func (s *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	var data bytes.Buffer
	hasData := false
	size := 0
	for {
		line, err := s.readLine()
		if err != nil {
			return sseEvent{}, err
		}
		size += len(line)
		if size > s.max {
			return sseEvent{}, fmt.Errorf("%w (%d bytes)", ErrEventTooLarge, s.max)
		}
		if len(line) == 0 {
			if !hasData {
				// Keep-alives and blank lines between events dispatch nothing.
				ev.name = ""
				size = 0
				continue
			}
			ev.data = data.Bytes()
			return ev, nil
		}
		field, value := splitField(line)
		switch field {
		case "event":
			ev.name = string(value)
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.Write(value)
			hasData = true
		}
	}
}

// splitField splits "name: value" (one space after the colon is not part of the value); a
// line starting with a colon is a comment, whose empty field name matches nothing.
func splitField(line []byte) (string, []byte) {
	i := bytes.IndexByte(line, ':')
	if i < 0 {
		return string(line), nil
	}
	value := line[i+1:]
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	return string(line[:i]), value
}

// readLine reads one line without its ending, refusing lines longer than the event bound
// before buffering them whole.
func (s *sseReader) readLine() ([]byte, error) {
	var long []byte
	for {
		chunk, err := s.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if len(long)+len(chunk) > s.max {
				return nil, fmt.Errorf("%w (%d bytes)", ErrEventTooLarge, s.max)
			}
			long = append(long, chunk...)
			continue
		}
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				// A last line without its ending cannot complete an event; a chunked body cut
				// short is a stream that ended early like any other.
				return nil, io.EOF
			}
			return nil, fmt.Errorf("koder-sandbox: reading event stream: %w", err)
		}
		line := chunk
		if long != nil {
			line = append(long, chunk...)
		} else {
			// ReadSlice's buffer is reused by the next read.
			line = append([]byte(nil), chunk...)
		}
		if len(line) > s.max {
			return nil, fmt.Errorf("%w (%d bytes)", ErrEventTooLarge, s.max)
		}
		line = bytes.TrimSuffix(line[:len(line)-1], []byte{'\r'})
		return line, nil
	}
}
