"""seqio tasks and mixtures of flax_xalign (installed as flax_xalign.tasks).

Importing this package registers the embedded Bible tasks (no data is read and
no vocabulary is trained until a dataset is built) and exposes the helpers the
trainer uses: `languages_of`, `get_vocabulary`, `get_provider`.
"""

from . import registry
from . import bible
from . import user
from .registry import get_provider
from .registry import get_vocabulary
from .registry import languages_of
from .registry import registered_names
