"""Writing a file whole or not at all: the scripts' outputs never exist half-written."""
import os
import tempfile


def new_file_mode():
    """The mode open() gives a new file: 0666 less the user's umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path, write, prefix=".tmp-"):
    """Calls write(tmp) on a temporary file beside `path`, then renames it to `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, new_file_mode())  # mkstemp's is 0600: give the user's umask's
        os.replace(tmp, path)  # nothing half-written under the final name
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
