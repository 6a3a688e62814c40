package fleet

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// readChatTemplate reads --chat-template as vLLM does: a file when there is
// one, else the value itself when it looks like a template.
func TestReadChatTemplate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "t.jinja")
	require.NoError(t, os.WriteFile(file, []byte("{{ messages[0].content }}"), 0o644))
	got, err := readChatTemplate(file)
	require.NoError(t, err)
	require.Equal(t, "{{ messages[0].content }}", got)

	got, err = readChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
	require.NoError(t, err)
	require.Equal(t, "{% for m in messages %}{{ m.content }}{% endfor %}", got)

	_, err = readChatTemplate(filepath.Join(dir, "missing.jinja"))
	require.ErrorContains(t, err, "no chat template file "+filepath.Join(dir, "missing.jinja"))

	empty := filepath.Join(dir, "empty.jinja")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))
	_, err = readChatTemplate(empty)
	require.ErrorContains(t, err, "is empty")
}
