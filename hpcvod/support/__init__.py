"""What every room of the submission side leans on and that belongs to none of them: the error a user can cause
(``errors``: one line, exit status 2) and careful file handling (``files``: bounded reads, atomic writes, private
folders). It imports nothing else of hpcvod, so every room may import it."""
