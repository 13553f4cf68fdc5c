package main

// The channel's framing: one frame is a 20-byte header, a JSON "meta" object
// and optional raw "data" bytes. Big-endian header:
//
//	magic "CRA1" | id u32 | meta_len u32 | data_len u32 | crc32(header[0:16]) u32
//
// The id names the call a frame belongs to (chosen by the host); replies and
// output of a call carry the call's id, so calls are multiplexed on one stream.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
)

const (
	headerLen = 20
	maxMeta   = 1 << 20
	maxData   = 8 << 20
)

var magic = []byte("CRA1")

var errBadFrame = errors.New("bad frame")

type frame struct {
	id   uint32
	meta []byte
	data []byte
}

func encodeFrame(id uint32, meta, data []byte) []byte {
	buf := make([]byte, headerLen+len(meta)+len(data))
	copy(buf, magic)
	binary.BigEndian.PutUint32(buf[4:], id)
	binary.BigEndian.PutUint32(buf[8:], uint32(len(meta)))
	binary.BigEndian.PutUint32(buf[12:], uint32(len(data)))
	binary.BigEndian.PutUint32(buf[16:], crc32.ChecksumIEEE(buf[:16]))
	copy(buf[headerLen:], meta)
	copy(buf[headerLen+len(meta):], data)
	return buf
}

// validHeader: the magic, the checksum and sizes a frame may have.
func validHeader(h []byte) bool {
	return bytes.Equal(h[:4], magic) &&
		crc32.ChecksumIEEE(h[:16]) == binary.BigEndian.Uint32(h[16:]) &&
		binary.BigEndian.Uint32(h[8:]) <= maxMeta && binary.BigEndian.Uint32(h[12:]) <= maxData
}

// skipToHeader drops bytes until a valid header starts the stream and says how
// many it dropped. A host that died halfway through a frame leaves the rest of
// it in the FIFO; the host that attaches next starts with a whole frame, so the
// stream is whole again from the next valid header on.
func skipToHeader(r *bufio.Reader) (int, error) {
	skipped := 0
	for {
		h, err := r.Peek(headerLen)
		if err != nil {
			return skipped, err
		}
		if validHeader(h) {
			return skipped, nil
		}
		buffered, _ := r.Peek(r.Buffered())
		drop := bytes.Index(buffered[1:], magic) + 1
		if drop == 0 { // no magic in what is buffered: keep a possible partial one
			drop = len(buffered) - len(magic) + 1
		}
		n, _ := r.Discard(drop)
		skipped += n
	}
}

func readFrame(r io.Reader) (frame, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return frame{}, err
	}
	if !bytes.Equal(h[:4], magic) {
		return frame{}, fmt.Errorf("%w: magic %q", errBadFrame, h[:4])
	}
	if crc32.ChecksumIEEE(h[:16]) != binary.BigEndian.Uint32(h[16:]) {
		return frame{}, fmt.Errorf("%w: header checksum", errBadFrame)
	}
	id := binary.BigEndian.Uint32(h[4:])
	metaLen := binary.BigEndian.Uint32(h[8:])
	dataLen := binary.BigEndian.Uint32(h[12:])
	if metaLen > maxMeta || dataLen > maxData {
		return frame{}, fmt.Errorf("%w: sizes %d/%d", errBadFrame, metaLen, dataLen)
	}
	body := make([]byte, int(metaLen)+int(dataLen))
	if _, err := io.ReadFull(r, body); err != nil {
		return frame{}, err
	}
	return frame{id: id, meta: body[:metaLen], data: body[metaLen:]}, nil
}

// sender writes whole frames; safe for concurrent use.
type sender struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *sender) send(id uint32, meta any, data []byte) error {
	m, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	buf := encodeFrame(id, m, data)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err = s.w.Write(buf)
	return err
}
